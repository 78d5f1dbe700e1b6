"""``torch.export`` and ONNX (onnxruntime) of one model per family, training and inference form.

A thin driver: the benchmark is :mod:`eqvit.bench.export` (also ``eqvit bench export``, from an installed
wheel too).
"""

from eqvit.bench.export import main

if __name__ == "__main__":
    main()
