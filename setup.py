"""Everything declarative is in setup.cfg; this file only declares what setup.cfg
cannot:
* the C hot path. optional=True: where no compiler is found the build goes on and
  the heartbeat writer and wrappers fall back to pure Python (slower, same records);
* ddpwatch-auto.pth, copied to the top of site-packages (beside the package, where
  Python's `site` runs it at every start-up): automatic heartbeats when
  DDPWATCH_AUTO=1, nothing otherwise (ddpwatch/rank/autoboot.py). build_py puts it
  in the wheel's root, and for an editable install (pip install -e, PEP 660) in
  the editable wheel's root too."""
import os

from setuptools import Extension, setup
from setuptools.command.build_py import build_py

PTH = "ddpwatch-auto.pth"


class build_py_with_pth(build_py):
    def run(self):
        super().run()
        here = os.path.dirname(os.path.abspath(__file__))
        target = self.build_lib
        if getattr(self, "editable_mode", False):
            # setuptools' editable_wheel ignores build_lib and packs the wheel from
            # the directory it set as install_lib (setuptools >= 64).
            target = self.distribution.get_command_obj("install").install_lib or target
        self.copy_file(os.path.join(here, "ddpwatch", "rank", PTH), os.path.join(target, PTH),
                       preserve_mode=False)

    def get_outputs(self, include_bytecode=True):
        return super().get_outputs(include_bytecode) + [os.path.join(self.build_lib, PTH)]


setup(ext_modules=[Extension("ddpwatch.heartbeat._hotpath", ["ddpwatch/heartbeat/_hotpath.c"], optional=True,
                             extra_compile_args=["-O2", "-std=c11"])],
      cmdclass={"build_py": build_py_with_pth})
