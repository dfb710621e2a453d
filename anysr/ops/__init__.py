"""Small numeric kernels shared by several layers: MATLAB-exact bicubic resize and colour conversion."""
