"""v4serve runtime, in parts that import only the parts below them (tests/test_layers.py):

    text/       tokenizer, detokenizer, grammar                 torch-free
    core/       config, requests, scheduler, pools, prefix cache torch-free, no I/O
    planning/   capacity, memory plan, admission                torch-free
    model/      the V4 forward in PyTorch;  weights/  its loader
    sampling/   the batch sampler and its per-slot state
    backends/   the kernel backends and their registry
    device/     the launcher of a generated kernel table, the pools, the model runner
    executor/   the Executor: the runner in this process, or a rank worker per rank
    engine/     the engine, its output processor and intake, the EngineClient protocol
    process/    the engine-core process, its client and messages, background compiles
"""
