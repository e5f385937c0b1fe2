// LinearAttention (mnngpu/ops/linear_attention.py) with its state on the device: the causal
// convolution and the gated delta rule, sequential over a forward's tokens inside each work-item
// and parallel over channels (the convolution) or over a v head's state columns (the delta rule).
// Built with KERNEL (the convolution's taps) and, for the delta rule, HEAD_K_DIM; L2NORM when q
// and k are normalised.
//
// Token t of channel c of the qkv input is at t * t_stride + c * c_stride: the graph's tensor is
// (seq, channels, 1, 1) or (1, channels, seq), and a verify block's saved copy is (rows, channels).
// Only the first `rows` tokens of a forward enter the state (a prefill chunk's padding does not);
// where `save` is set they are also copied, as (rows, channels) rows, into `saved` (and gate and
// beta into theirs), which lets a later forward take the block back and run its kept rows again.
// The state is float32 at every precision.

#define HISTORY (KERNEL - 1)

// The window of one channel: its last HISTORY inputs, then the current one.
inline void load_history(float* window, __global const float* conv_state, int c) {
    for (int j = 0; j < HISTORY; j++) window[j] = conv_state[c * HISTORY + j];
}

inline float convolve(const float* window, __global const float* weight, int c) {
    float acc = window[0] * weight[c * KERNEL];
    for (int j = 1; j < KERNEL; j++) acc += window[j] * weight[c * KERNEL + j];
    return acc;
}

// Shift the window by one token; after the last real token, what is left is the new state.
inline void advance(float* window, __global float* conv_state, int c, int t, int rows) {
    for (int j = 0; j < HISTORY; j++) window[j] = window[j + 1];
    if (t == rows - 1)
        for (int j = 0; j < HISTORY; j++) conv_state[c * HISTORY + j] = window[j];
}

// LFM2: qkv holds b, c and x blocks of `channels`; out (seq, channels) = c * conv(b * x).
__kernel void short_conv(__global const real_t* qkv, int t_stride, int c_stride,
                         __global const float* weight, __global float* conv_state, __global real_t* out,
                         int channels, int seq, int rows, __global real_t* saved, int save) {
    const int c = get_global_id(0);
    if (c >= channels) return;
    float window[KERNEL];
    load_history(window, conv_state, c);
    for (int t = 0; t < seq; t++) {
        const int at = t * t_stride;
        const float b = LOAD(qkv, at + c * c_stride);
        const float gate = LOAD(qkv, at + (channels + c) * c_stride);
        const float x = LOAD(qkv, at + (2 * channels + c) * c_stride);
        window[HISTORY] = b * x;
        STORE(out, t * channels + c, gate * convolve(window, weight, c));
        if (save && t < rows) {
            STORE(saved, t * 3 * channels + c, b);
            STORE(saved, t * 3 * channels + channels + c, gate);
            STORE(saved, t * 3 * channels + 2 * channels + c, x);
        }
        advance(window, conv_state, c, t, rows);
    }
}

// Qwen3.5: mixed (seq, channels) = SiLU(conv(qkv)), float32, for qk_norm and delta_rule. The
// first `heads` work-items also save gate and beta (seq, heads).
__kernel void conv_silu(__global const real_t* qkv, int t_stride, int c_stride,
                        __global const float* weight, __global float* conv_state, __global float* mixed,
                        int channels, int seq, int rows, __global real_t* saved, int save,
                        __global const real_t* gate, __global const real_t* beta, int heads,
                        __global real_t* saved_gate, __global real_t* saved_beta) {
    const int c = get_global_id(0);
    if (c >= channels) return;
    float window[KERNEL];
    load_history(window, conv_state, c);
    for (int t = 0; t < seq; t++) {
        const float x = LOAD(qkv, t * t_stride + c * c_stride);
        window[HISTORY] = x;
        const float acc = convolve(window, weight, c);
        mixed[t * channels + c] = acc / (1.0f + exp(-acc));
        if (save && t < rows) {
            STORE(saved, t * channels + c, x);
            if (c < heads) {
                STORE(saved_gate, t * heads + c, LOAD(gate, t * heads + c));
                STORE(saved_beta, t * heads + c, LOAD(beta, t * heads + c));
            }
        }
        advance(window, conv_state, c, t, rows);
    }
}

// One work-item per (token, k head, q or k): the head's HEAD_K_DIM values of mixed made unit
// length (under L2NORM), q's then scaled by 1 / sqrt(HEAD_K_DIM).
__kernel void qk_norm(__global float* mixed, int channels, int k_heads, int seq) {
    const int i = get_global_id(0);
    if (i >= seq * 2 * k_heads) return;
    const int t = i / (2 * k_heads), head = i % (2 * k_heads);   // heads 0..k_heads-1 are q's
    __global float* x = mixed + t * channels + head * HEAD_K_DIM;
    float scale = head < k_heads ? rsqrt((float)HEAD_K_DIM) : 1.0f;
#ifdef L2NORM
    float sum = 0.0f;
    for (int d = 0; d < HEAD_K_DIM; d++) sum += x[d] * x[d];
    const float norm = 1.0f / sqrt(sum + 1e-6f);
    for (int d = 0; d < HEAD_K_DIM; d++) x[d] *= norm;
#endif
    for (int d = 0; d < HEAD_K_DIM; d++) x[d] *= scale;
}

// One work-item per (v head h, state column j): S[:, j] of h's (HEAD_K_DIM, head_v_dim) state
// stays in registers over the tokens. Per token, with q and k of k head h / (heads / k_heads):
// S <- exp(gate) S; delta = beta (v - S^T k); S <- S + k delta; out = S^T q. Rows past `rows`
// give 0 and leave S alone.
__kernel void delta_rule(__global const float* mixed, int channels, __global const real_t* gate,
                         __global const real_t* beta, __global float* state, __global real_t* out,
                         int heads, int head_v_dim, int k_heads, int seq, int rows) {
    const int i = get_global_id(0);
    if (i >= heads * head_v_dim) return;
    const int h = i / head_v_dim, j = i % head_v_dim;
    const int kh = h / (heads / k_heads);
    const int keys = k_heads * HEAD_K_DIM;
    __global float* column = state + h * HEAD_K_DIM * head_v_dim + j;
    float s[HEAD_K_DIM];
    for (int d = 0; d < HEAD_K_DIM; d++) s[d] = column[d * head_v_dim];
    for (int t = 0; t < rows; t++) {
        __global const float* q = mixed + t * channels + kh * HEAD_K_DIM;
        __global const float* k = q + keys;
        const float v = mixed[t * channels + 2 * keys + h * head_v_dim + j];
        const float decay = exp(LOAD(gate, t * heads + h));
        float recalled = 0.0f;
        for (int d = 0; d < HEAD_K_DIM; d++) {
            s[d] *= decay;
            recalled += s[d] * k[d];
        }
        const float delta = LOAD(beta, t * heads + h) * (v - recalled);
        float y = 0.0f;
        for (int d = 0; d < HEAD_K_DIM; d++) {
            s[d] += k[d] * delta;
            y += s[d] * q[d];
        }
        STORE(out, t * heads * head_v_dim + i, y);
    }
    for (int t = rows; t < seq; t++) STORE(out, t * heads * head_v_dim + i, 0.0f);
    for (int d = 0; d < HEAD_K_DIM; d++) column[d * head_v_dim] = s[d];
}
