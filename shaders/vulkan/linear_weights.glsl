// The weight layout shared by linear_gemv.comp and linear_gemm.comp (bindings 1-4; with
// -DGATED a second layer, `up`, at bindings 6-9: the kernels then write up * silu(gate)).
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
#define WEIGHT_T STORE
#else
#define WEIGHT_T uvec4
#endif
// one layer's buffers, from binding B on
#define LAYER_BUFFERS(B, L) \
    layout(std430, binding = B) readonly buffer L##W { WEIGHT_T L##weight[]; }; \
    layout(std430, binding = B + 1) readonly buffer L##S { vec4 L##scales[]; }; \
    layout(std430, binding = B + 2) readonly buffer L##Z { vec4 L##zeros[]; }; \
    layout(std430, binding = B + 3) readonly buffer L##B { vec4 L##bias[]; };
LAYER_BUFFERS(1, gate_)
#ifdef GATED
LAYER_BUFFERS(6, up_)
// layer 0 is the gate (or the only layer), layer 1 the up projection; `layer` is a constant
// at every call, so the choice folds away
#define PICK(layer, gate, up) ((layer) == 0u ? (gate) : (up))
#else
#define PICK(layer, gate, up) (gate)
#endif

// -DEXPERT (linear_gemv.comp): the buffers stack every expert of a MoE op, each laid out as one
// layer; choose_expert() points these at the chosen expert's first element before its loads.
#ifdef EXPERT
uint expert_weights = 0u;
uint expert_blocks = 0u;
uint expert_bias = 0u;
#else
const uint expert_weights = 0u;
const uint expert_blocks = 0u;
const uint expert_bias = 0u;
#endif

// The quad's dequantized weights for inputs 8g .. 8g + 7: lo[c] holds inputs 0-3 of channel
// 4q + c, hi[c] inputs 4-7.
void load_group(uint layer, uint g, uint q, uint quads, uint blk, out vec4 lo[4], out vec4 hi[4]) {
#if defined(DENSE)
    for (uint c = 0u; c < 4u; c++) {
        uint at = expert_weights + ((g * quads + q) * 4u + c) * 8u;
        float v[8];
        for (uint i = 0u; i < 8u; i++) v[i] = float(PICK(layer, gate_weight[at + i], up_weight[at + i]));
        lo[c] = vec4(v[0], v[1], v[2], v[3]);
        hi[c] = vec4(v[4], v[5], v[6], v[7]);
    }
#else
    // unpackUnorm4x8 turns 4 bytes into 4 floats / 255: the 255 is folded into the scale
    uint sb = expert_blocks + blk * quads + q;
    vec4 scale = PICK(layer, gate_scales[sb], up_scales[sb]) * 255.0;
    vec4 zero = PICK(layer, gate_zeros[sb], up_zeros[sb]);
#if defined(Q4)
    uint at = expert_weights + g * quads + q;
    uvec4 word = PICK(layer, gate_weight[at], up_weight[at]);
    for (uint c = 0u; c < 4u; c++) {
        lo[c] = unpackUnorm4x8(word[c] & 0x0F0F0F0Fu) * scale[c] + zero[c];
        hi[c] = unpackUnorm4x8((word[c] >> 4u) & 0x0F0F0F0Fu) * scale[c] + zero[c];
    }
#else
    uint at = expert_weights + (2u * g) * quads + q;
    uvec4 first = PICK(layer, gate_weight[at], up_weight[at]);
    uvec4 second = PICK(layer, gate_weight[at + quads], up_weight[at + quads]);
    for (uint c = 0u; c < 4u; c++) {
        lo[c] = unpackUnorm4x8(first[c]) * scale[c] + zero[c];
        hi[c] = unpackUnorm4x8(second[c]) * scale[c] + zero[c];
    }
#endif
#endif
}

#if !defined(DENSE)
// The quad's codes for inputs 8g .. 8g + 7 as floats, unscaled: lo[c] inputs 0-3 of channel
// 4q + c, hi[c] inputs 4-7. The kernels sum a block's codes times x and scale once a block:
//     sum (u s + z) x = s sum u x + z sum x      (block_terms)
void load_codes(uint layer, uint g, uint q, uint quads, out vec4 lo[4], out vec4 hi[4]) {
#if defined(Q4)
    uint at = expert_weights + g * quads + q;
    uvec4 word = PICK(layer, gate_weight[at], up_weight[at]);
    for (uint c = 0u; c < 4u; c++) {
        uint w = word[c];   // byte j: input j in its low nibble, input j + 4 in its high one
        lo[c] = vec4(uvec4(w, w >> 8u, w >> 16u, w >> 24u) & 0xFu);
        hi[c] = vec4(uvec4(w >> 4u, w >> 12u, w >> 20u, w >> 28u) & 0xFu);
    }
#else
    uint at = expert_weights + (2u * g) * quads + q;
    uvec4 first = PICK(layer, gate_weight[at], up_weight[at]);
    uvec4 second = PICK(layer, gate_weight[at + quads], up_weight[at + quads]);
    for (uint c = 0u; c < 4u; c++) {
        uint u = first[c], v = second[c];   // byte j: input j, then input j + 4
        lo[c] = vec4(uvec4(u, u >> 8u, u >> 16u, u >> 24u) & 0xFFu);
        hi[c] = vec4(uvec4(v, v >> 8u, v >> 16u, v >> 24u) & 0xFFu);
    }
#endif
}

// Block b's share of the quad's outputs: its scale times the codes' dot products, its zero times
// the sum of x over the block (xs: that sum as 4 partial sums).
vec4 block_terms(uint layer, uint b, uint q, uint quads, vec4 dots, vec4 xs) {
    uint sb = expert_blocks + b * quads + q;
    return dots * PICK(layer, gate_scales[sb], up_scales[sb])
         + PICK(layer, gate_zeros[sb], up_zeros[sb]) * (xs.x + xs.y + xs.z + xs.w);
}
#endif

vec4 layer_bias(uint layer, uint q) {
    return pc.has_bias != 0u ? PICK(layer, gate_bias[expert_bias + q], up_bias[expert_bias + q]) : vec4(0.0);
}

// x . W of one group of 8 inputs (xa, xb) for the quad's 4 channels
vec4 quad_dot(vec4 lo[4], vec4 hi[4], vec4 xa, vec4 xb) {
    return vec4(dot(lo[0], xa) + dot(hi[0], xb), dot(lo[1], xa) + dot(hi[1], xb),
                dot(lo[2], xa) + dot(hi[2], xb), dot(lo[3], xa) + dot(hi[3], xb));
}

vec4 silu(vec4 v) {
    return v / (1.0 + exp(-v));
}
