"""Everything declarative is in setup.cfg; this file only declares the C hot path,
which setup.cfg cannot. optional=True: where no compiler is found the build goes
on and the heartbeat writer and wrappers fall back to pure Python (slower, same
records)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("ddpwatch.heartbeat._hotpath", ["ddpwatch/heartbeat/_hotpath.c"], optional=True,
                             extra_compile_args=["-O2", "-std=c11"])])
