// The MoE router's ops. Each views its input as (outer, n, inner) and gives one work-item to
// each (outer, inner) line of n values: routers are narrow (n = the number of experts).

__kernel void softmax_lines(__global real_t* out, __global const real_t* x, const int outer, const int n,
                            const int inner) {
    const int line = get_global_id(0);
    if (line >= outer * inner) return;
    const int o = line / inner, i = line - o * inner;
    const size_t base = (size_t)o * n * inner + i;
    float top = -INFINITY;
    for (int j = 0; j < n; j++) top = fmax(top, LOAD(x, base + (size_t)j * inner));
    float sum = 0.0f;
    for (int j = 0; j < n; j++) sum += exp(LOAD(x, base + (size_t)j * inner) - top);
    for (int j = 0; j < n; j++) {
        const size_t at = base + (size_t)j * inner;
        STORE(out, at, exp(LOAD(x, at) - top) / sum);
    }
}

// The k largest of each line, best first; equal values keep the lower index first. Each pick is
// the best value ranked after the previous pick, so no per-line scratch is needed.
__kernel void top_k_lines(__global real_t* values, __global int* indices, __global const real_t* x,
                          const int outer, const int n, const int inner, const int k) {
    const int line = get_global_id(0);
    if (line >= outer * inner) return;
    const int o = line / inner, i = line - o * inner;
    const size_t base = (size_t)o * n * inner + i;
    const size_t out_base = (size_t)o * k * inner + i;
    float last = INFINITY;
    int last_index = -1;
    for (int pick = 0; pick < k; pick++) {
        float best = -INFINITY;
        int best_index = -1;
        for (int j = 0; j < n; j++) {
            const float v = LOAD(x, base + (size_t)j * inner);
            const bool after = v < last || (v == last && j > last_index);
            if (after && (best_index < 0 || v > best)) { best = v; best_index = j; }
        }
        STORE(values, out_base + (size_t)pick * inner, best);
        indices[out_base + (size_t)pick * inner] = best_index;
        last = best;
        last_index = best_index;
    }
}

// op: 0 sum, 1 mean, 2 max, 3 min, 4 product (runtime/routing.py REDUCE_CODES)
__kernel void reduce_lines(__global real_t* out, __global const real_t* x, const int outer, const int n,
                           const int inner, const int op) {
    const int line = get_global_id(0);
    if (line >= outer * inner) return;
    const int o = line / inner, i = line - o * inner;
    const size_t base = (size_t)o * n * inner + i;
    float acc = LOAD(x, base);
    for (int j = 1; j < n; j++) {
        const float v = LOAD(x, base + (size_t)j * inner);
        acc = op == 2 ? fmax(acc, v) : op == 3 ? fmin(acc, v) : op == 4 ? acc * v : acc + v;
    }
    STORE(out, line, op == 1 ? acc / n : acc);
}

// out = (acc +) w * y over (rows, width), where w per row is the weight the router gave `expert`
// among that row's k choices (zero where it did not choose it).
__kernel void expert_add(__global real_t* out, __global const real_t* y, __global const real_t* weights,
                         __global const int* selected, __global const real_t* acc, const int rows, const int width,
                         const int k, const int expert, const int has_acc) {
    const int at = get_global_id(0);
    if (at >= rows * width) return;
    const int row = at / width;
    float w = 0.0f;
    for (int j = 0; j < k; j++)
        if (selected[row * k + j] == expert) w += LOAD(weights, row * k + j);
    float v = w * LOAD(y, at);
    if (has_acc) v += LOAD(acc, at);
    STORE(out, at, v);
}
