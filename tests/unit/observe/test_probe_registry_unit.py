"""One probe per module, registered under the module's own name: config
(`probes: {name: false}`), /status's `probe_errors` and
`ddpwatch_probe_success{probe}` use that name, so finding a probe's code from
what an operator sees is opening observe/probes/<name>.py."""
from __future__ import annotations

import pkgutil

from ddpwatch.observe import probes


def test_every_probe_module_registers_one_probe_named_after_it():
    modules = {m.name for m in pkgutil.iter_modules(probes.__path__)}
    registered = probes.load_all()
    by_module = {}
    for name, spec in registered.items():
        by_module.setdefault(spec.impl.__module__.rsplit(".", 1)[-1], []).append(name)
    assert by_module == {m: [m] for m in modules}


def test_what_two_probes_share_is_kept_once():
    """nshost reads namespaces' interfaces through the sockets probe's object
    (`uses`): one `ip addr` a minute per namespace for both, within one budget."""
    made = probes.make_all()
    assert set(made) == set(probes.load_all())
    assert made["nshost"].sockets is made["sockets"]
    assert all(made[used] for spec in probes.load_all().values() for used in spec.uses)
