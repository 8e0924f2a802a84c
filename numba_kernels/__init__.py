"""Reduction and copy kernels (CUDA and CPU) with explicit block counts.

Filled by the numba_kernels issue; hpccoll's host path reduces with NumPy ufuncs
(hpccoll.buffers.reduce_into) until then.  Nothing here imports numba eagerly.
"""
