"""Golden traces and containers, shipped inside the wheel as ``umlos_cuda._golden`` (see pyproject.toml)."""
