"""The vulkan backend."""
