"""The CUDA C++ sources, shipped inside the wheel as ``umlos_cuda._kernels`` (see pyproject.toml)."""
