"""Build ratrain: the Python package, the `ratrain` command and the native kernels.

The kernels (native/*.c) are compiled into one extension, `ratrain.kernels`, through its
Cython bindings. SIMD paths are compiled per function with target attributes and chosen
at run time, so one wheel runs on machines with and without AVX-512.
"""
import glob
import os

import numpy
from Cython.Build import cythonize
from setuptools import Extension, find_packages, setup

NATIVE_SOURCES = sorted(glob.glob(os.path.join("native", "src", "*.c"))
                        + glob.glob(os.path.join("native", "ref", "*.c")))

kernels = Extension(
    "ratrain.kernels",
    sources=["ratrain/kernels.pyx"] + NATIVE_SOURCES,
    include_dirs=["native/include", "native/src", numpy.get_include()],
    # OpenMP threads stand for a cluster's cores; SIMD paths use per-file target pragmas,
    # so the base flags stay generic x86-64 and one binary runs without AVX-512.
    extra_compile_args=["-O3", "-std=c11", "-fno-strict-aliasing", "-fopenmp", "-pthread"],
    extra_link_args=["-fopenmp", "-pthread", "-lm"],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
)

setup(
    name="ratrain",
    version="0.1.0",
    description="Resource-aware 1F1B + DP training compiler and runtime (RATrain)",
    long_description=open("README.md").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["ratrain", "ratrain.*"]),
    package_data={"ratrain": ["*.pxd", "hw/*.json", "models/presets/*.json"]},
    ext_modules=cythonize([kernels], language_level=3,
                          compiler_directives={"boundscheck": False, "wraparound": False}),
    install_requires=[
        "jax>=0.4.30",
        "numpy>=1.26",
        "ml_dtypes>=0.4",           # numpy's bfloat16 for --precision bf16 (jax needs it too)
        "networkx>=3.0",
        "cython>=3.0",
        "mpi4py>=4.0",
        "mpich",
        "safetensors>=0.4",
        "tokenizers>=0.15",         # the checkpoint's tokenizer.json for --data text
        "matplotlib>=3.7",          # schedule and memory pictures of `ratrain inspect`
    ],
    extras_require={
        # torch and transformers: the tests check ratrain's math and checkpoints against
        # the real models (CPU build of torch; 2.13.0 is the one this project tests with)
        # tensorboard: writes the --log-to tensorboard events through torch's writer and
        # reads them back
        "test": ["pytest>=8", "threadpoolctl>=3", "torch==2.13.0", "transformers>=5,<6",
                 "tensorboard>=2.14"],
        # --log-to (rt/loggers.py, NOTE [optional loggers])
        "tensorboard": ["tensorboardX>=2.6"],
        "wandb": ["wandb>=0.16"],
        # --data as a .parquet file or a saved Hugging Face datasets directory (their tests
        # skip without them)
        "data": ["pyarrow>=14", "datasets>=2.14"],
    },
    entry_points={"console_scripts": ["ratrain=ratrain.cli:main"]},
    zip_safe=False,
)
