"""The DeepSeek V4 forward in plain PyTorch, reading and writing only the grouped pools.

args        architecture facts derived from a generated CONFIG
params      the loaded weights: dense tensors by official name, experts per rank
rope        interleaved partial RoPE, plain and YaRN
norms       RMS norms
hyper       mHC hyper-connections (Sinkhorn) and the hc_head collapse
paging      addressing of ring and full pools through block tables
compressor  CSA/HCA compressors: state rows and compressed entries in the pools
indexer     the lightning indexer's top-k over compressed keys
attention   shared-KV MQA with sink over window + compressed keys; grouped output
moe         sqrt-softplus / hash routing, expert-parallel routed experts, shared expert
block       one transformer block (attention and MoE inside mHC)
forward     the main model and the MTP block over a batch of segments
"""
