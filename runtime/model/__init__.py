"""The DeepSeek V4 and V4.1 forwards in plain PyTorch, reading and writing only the grouped
pools (V4.1's facts: V41.md).

args        architecture facts derived from a generated CONFIG
params      the loaded weights: dense tensors by official name, experts per rank
rope        interleaved partial RoPE, plain and YaRN
norms       RMS norms
hyper       mHC hyper-connections (Sinkhorn), V4's hc_head collapse, V4.1's single pass
paging      addressing of ring and full pools through block tables
compressor  CSA/HCA compressors and V4.1's: state rows and compressed entries in the pools
indexer     the lightning indexer's top-k over compressed keys; V4.1's candidate blocks
attention   shared-KV MQA with sink over window + compressed keys; grouped output
csa2        V4.1's attention by layer role, reading its sources' pages
sources     what V4.1's source layers hand the layers above them within one launch
engram      V4.1's Engram memory: token map, n-gram hashes, table rows, gate
moe         sqrt-softplus / hash routing, expert-parallel routed experts, shared expert
block       one transformer block (attention and MoE inside mHC; V4.1's single pass)
forward     the main model and the MTP block over a batch of segments
forward_v41 the V4.1 main model: Engram, single-pass blocks, the collapse and head
dspark      V4.1's DSpark drafter: main_kv rings, stage blocks, Markov bias, confidence
v41_formats V4.1's served entry formats (fp8_32, fp4_16, fp4_32)
"""
