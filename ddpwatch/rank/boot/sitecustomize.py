"""Automatic heartbeats for the processes `ddpwatch exec` starts (ddpwatch/rank/autoboot.py).

`ddpwatch exec` puts this directory first on PYTHONPATH, so every Python started
under it runs this file at start-up, whether or not ddpwatch (and its .pth) is
installed in that interpreter's environment. It imports ddpwatch from that
environment if it can, else from where `ddpwatch exec` found it
(DDPWATCH_AUTO_HOME, the directory holding the ddpwatch package; only the
package is loaded from there, nothing else on that path becomes importable).
Then it runs the sitecustomize it hides (Debian's, a site's own), as Python
would have. Nothing here may stop the process: a failure is one line on stderr.
"""


def _ddpwatch_boot():
    import os
    import sys
    if os.environ.get("DDPWATCH_AUTO") != "1":
        return
    try:
        try:
            from ddpwatch.rank import autoboot
        except ImportError:
            home = os.environ.get("DDPWATCH_AUTO_HOME", "")
            init = os.path.join(home, "ddpwatch", "__init__.py")
            if not home or not os.path.isfile(init):
                raise
            import importlib.util
            sys.modules.pop("ddpwatch", None)
            spec = importlib.util.spec_from_file_location(
                "ddpwatch", init, submodule_search_locations=[os.path.dirname(init)])
            module = importlib.util.module_from_spec(spec)
            sys.modules["ddpwatch"] = module
            try:
                spec.loader.exec_module(module)
            except BaseException:
                sys.modules.pop("ddpwatch", None)
                raise
            from ddpwatch.rank import autoboot
        autoboot.boot()
    except Exception as err:
        if not os.environ.get("DDPWATCH_AUTO_WARNED"):
            os.environ["DDPWATCH_AUTO_WARNED"] = "1"
            sys.stderr.write(f"ddpwatch: automatic heartbeats off in {sys.executable}: "
                             f"{err!r}; training goes on without them (unset DDPWATCH_AUTO "
                             f"to silence)\n")


def _chain():
    """Run the next sitecustomize on sys.path, the one this file hides."""
    import importlib.machinery
    import importlib.util
    import os
    import sys
    here = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    rest = [p for p in sys.path if os.path.realpath(os.path.abspath(p or ".")) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)  # its errors are reported by site, as without us


_ddpwatch_boot()
_chain()
