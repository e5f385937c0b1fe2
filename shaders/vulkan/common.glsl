// Shared by every mnngpu Vulkan kernel: the grid helpers, and STORE, the element type of the
// KV cache and of unquantized weights. Activations are always float. Built with -DFP16
// (precision low), STORE is float16_t, widened to float for arithmetic.
#ifdef FP16
#extension GL_EXT_shader_16bit_storage : require
#extension GL_EXT_shader_explicit_arithmetic_types_float16 : require
#define STORE float16_t
#define STORE4 f16vec4
#else
#define STORE float
#define STORE4 vec4
#endif

// Dispatches larger than maxComputeWorkGroupCount.x are laid out as a 2-D grid of groups.
uint group_index() {
    return gl_WorkGroupID.y * gl_NumWorkGroups.x + gl_WorkGroupID.x;
}

// A macro, not a function: gl_WorkGroupSize is only known after the kernel's local_size layout.
#define global_index() (group_index() * gl_WorkGroupSize.x + gl_LocalInvocationID.x)
