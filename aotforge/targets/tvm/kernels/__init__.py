"""Hand-written tensorized TIR kernels (AVX-512 VNNI int8 dense and convolution) the rewrites call."""
