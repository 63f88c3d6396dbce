"""The heartbeat channel between ranks (writers) and the daemon (readers).

torch-free: the daemon imports this to read records.
"""
from .layout import LAYOUT_VERSION, OP_CODE, OPS, Phase, Record, RingEntry, LayoutError
from .paths import default_dir
from .reader import Skipped, read_dir, read_file
from .writer import HeartbeatWriter, NullWriter, open_writer

__all__ = ["LAYOUT_VERSION", "OP_CODE", "OPS", "Phase", "Record", "RingEntry", "LayoutError",
           "default_dir", "Skipped", "read_dir", "read_file", "HeartbeatWriter", "NullWriter",
           "open_writer"]
