// Where a row's key and value go in the KV cache, and which cached entries it sees. One buffer per
// layer holds every sequence's region, [slot][kv_heads][capacity][head_dim]; a region starts at
// cache row `base` (slot * kv_heads * capacity). A forward of one sequence (pc.batched 0) reads
// the step header: row s sits at position past + s of the region at `base`. A batched forward
// (rows of several sequences) reads each row's (base, position) from the rows table; a row no
// sequence holds has base IDLE_ROW: it stores nothing and sees nothing.
// Includers define STEP_BINDING and ROWS_BINDING before including this file.
#define IDLE_ROW 0xFFFFFFFFu
layout(std430, binding = STEP_BINDING) readonly buffer Step { uint past; uint base; } step;
layout(std430, binding = ROWS_BINDING) readonly buffer Rows { uvec2 places[]; } rows_table;

// (cache row of the region's start, position of row s in it)
uvec2 row_place(uint s, uint batched) {
    return batched != 0u ? rows_table.places[s] : uvec2(step.base, step.past + s);
}
