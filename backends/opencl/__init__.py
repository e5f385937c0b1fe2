"""The opencl backend."""
