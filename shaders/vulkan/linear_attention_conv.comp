#version 450
// LinearAttention's causal convolution (backends/vulkan/ops/linear_attention.py), one invocation
// per channel looping over the forward's tokens, its last KERNEL - 1 inputs (the conv state,
// float32) carried from forward to forward. Built as SHORT_CONV (LFM2: qkv holds b, c and x
// blocks; out (seq, channels) = c * conv(b * x)) or as the gated delta rule's first step (mixed
// (seq, channels) = SiLU(conv(qkv)), for linear_attention_qk_norm and linear_attention_delta).
//
// Token t of channel c of qkv is at t * t_stride + c * c_stride. Only the first ctl.rows tokens
// enter the state; where ctl.save is set they are also copied, as (rows, width) rows, into the
// saved buffers (gate and beta too, by the first `heads` invocations), so that a later forward can
// take a verify block back and run its kept rows again.
#include "common.glsl"
layout(local_size_x = 64) in;
layout(std430, binding = 0) readonly buffer Qkv { float qkv[]; };
layout(std430, binding = 1) readonly buffer Weight { float weight[]; };
layout(std430, binding = 2) buffer ConvState { float conv_state[]; };
layout(std430, binding = 3) writeonly buffer Out { float out_rows[]; };
layout(std430, binding = 4) writeonly buffer Saved { float saved[]; };
layout(std430, binding = 5) readonly buffer Control { uint rows; uint save; } ctl;
#ifndef SHORT_CONV
layout(std430, binding = 6) readonly buffer Gate { float gate[]; };
layout(std430, binding = 7) readonly buffer Beta { float beta[]; };
layout(std430, binding = 8) writeonly buffer SavedGate { float saved_gate[]; };
layout(std430, binding = 9) writeonly buffer SavedBeta { float saved_beta[]; };
#endif
layout(push_constant) uniform Push {
    uint t_stride; uint c_stride; uint channels; uint seq; uint kernel; uint heads;
} pc;

#define MAX_KERNEL 16

void main() {
    uint c = global_index();
    if (c >= pc.channels) return;
    uint history = pc.kernel - 1;
    float window[MAX_KERNEL];
    for (uint j = 0; j < history; j++) window[j] = conv_state[c * history + j];
    for (uint t = 0; t < pc.seq; t++) {
        uint at = t * pc.t_stride;
#ifdef SHORT_CONV
        float b = qkv[at + c * pc.c_stride];
        float gate_c = qkv[at + (pc.channels + c) * pc.c_stride];
        float x = qkv[at + (2 * pc.channels + c) * pc.c_stride];
        window[history] = b * x;
#else
        float x = qkv[at + c * pc.c_stride];
        window[history] = x;
#endif
        float acc = window[0] * weight[c * pc.kernel];
        for (uint j = 1; j < pc.kernel; j++) acc += window[j] * weight[c * pc.kernel + j];
#ifdef SHORT_CONV
        out_rows[t * pc.channels + c] = gate_c * acc;
        if (ctl.save != 0 && t < ctl.rows) {
            saved[t * 3 * pc.channels + c] = b;
            saved[t * 3 * pc.channels + pc.channels + c] = gate_c;
            saved[t * 3 * pc.channels + 2 * pc.channels + c] = x;
        }
#else
        out_rows[t * pc.channels + c] = acc / (1.0 + exp(-acc));
        if (ctl.save != 0 && t < ctl.rows) {
            saved[t * pc.channels + c] = x;
            if (c < pc.heads) {
                saved_gate[t * pc.heads + c] = gate[t * pc.heads + c];
                saved_beta[t * pc.heads + c] = beta[t * pc.heads + c];
            }
        }
#endif
        for (uint j = 0; j < history; j++) window[j] = window[j + 1];
        if (t + 1 == ctl.rows)
            for (uint j = 0; j < history; j++) conv_state[c * history + j] = window[j];
    }
}
