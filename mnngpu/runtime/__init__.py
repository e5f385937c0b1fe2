"""MNN's runtime layers, one module each: Module.load, PipelineModule, StaticModule, Session,
Pipeline and placement, the schedule and module pool, the KV cache, and the checks of a graph."""
