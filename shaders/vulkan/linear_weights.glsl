// The weight layout shared by linear_gemv.comp and linear_gemm.comp (bindings 1-4).
//
// Weights are stored group-major: for each group of 8 inputs, the output channels follow one
// another, so an invocation reads 4 neighbouring channels (a "quad") with one 16-byte load and
// neighbouring invocations read neighbouring memory. Kinds (one -D each):
//   Q4:    weight[g][oc] is a uint of 8 four-bit codes, byte j = input j (low nibble), j + 4 (high)
//   Q8:    weight[2g + h][oc] is a uint of 4 one-byte codes, inputs 4h .. 4h + 3
//   DENSE: weight[g][oc][8] in STORE (fp16 with -DFP16)
// Quantized: w = code * scale[block][oc] + zero[block][oc]; scales, zeros and bias are float at
// every precision (an fp16 zero point would shift all of its block's weights alike).
#if defined(DENSE)
layout(std430, binding = 1) readonly buffer W { STORE weight[]; };
#else
layout(std430, binding = 1) readonly buffer W { uvec4 weight[]; };
#endif
layout(std430, binding = 2) readonly buffer Scales { vec4 scales[]; };
layout(std430, binding = 3) readonly buffer Zeros { vec4 zeros[]; };
layout(std430, binding = 4) readonly buffer Bias { vec4 bias[]; };

// The quad's dequantized weights for inputs 8g .. 8g + 7: lo[c] holds inputs 0-3 of channel
// 4q + c, hi[c] inputs 4-7.
void load_group(uint g, uint q, uint quads, uint blk, out vec4 lo[4], out vec4 hi[4]) {
#if defined(DENSE)
    for (uint c = 0u; c < 4u; c++) {
        uint at = ((g * quads + q) * 4u + c) * 8u;
        lo[c] = vec4(float(weight[at]), float(weight[at + 1u]), float(weight[at + 2u]), float(weight[at + 3u]));
        hi[c] = vec4(float(weight[at + 4u]), float(weight[at + 5u]), float(weight[at + 6u]), float(weight[at + 7u]));
    }
#else
    // unpackUnorm4x8 turns 4 bytes into 4 floats / 255: the 255 is folded into the scale
    vec4 scale = scales[blk * quads + q] * 255.0;
    vec4 zero = zeros[blk * quads + q];
#if defined(Q4)
    uvec4 word = weight[g * quads + q];
    for (uint c = 0u; c < 4u; c++) {
        lo[c] = unpackUnorm4x8(word[c] & 0x0F0F0F0Fu) * scale[c] + zero[c];
        hi[c] = unpackUnorm4x8((word[c] >> 4u) & 0x0F0F0F0Fu) * scale[c] + zero[c];
    }
#else
    uvec4 first = weight[(2u * g) * quads + q];
    uvec4 second = weight[(2u * g + 1u) * quads + q];
    for (uint c = 0u; c < 4u; c++) {
        lo[c] = unpackUnorm4x8(first[c]) * scale[c] + zero[c];
        hi[c] = unpackUnorm4x8(second[c]) * scale[c] + zero[c];
    }
#endif
#endif
}
