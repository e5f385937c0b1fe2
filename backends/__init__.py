"""Compute backends, one folder each: cpu, opencl, vulkan, cuda."""
