"""The paper's arithmetic: clients, the parameter server, update rules, protocols, the flat network."""
# Every import of a protocol passes here first: the optimal-time protocols register themselves in
# repro.asgd.protocols.PROTOCOLS beside async, sync and ssp, without protocols importing them back.
from repro.asgd import optimal as _optimal  # noqa: F401
