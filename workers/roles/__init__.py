"""The PDD serving roles over the network: router, P (prefill), RLD and MD (decode).

Module map (one concept each):
  config     typed, validated deployment config (YAML -> dataclasses); addresses and ports
  events     JSON-lines event logs on the shared monotonic clock
  layerhook  taps the engine's prefill so KV streams layer by layer as it is produced
  server     gRPC server plumbing shared by every role: health, stats, lifecycle
  prefill    the P role: prefill and dual-path KV transfer (asks the MD's DRC first)
  decode     the RLD and MD roles: eager decoding, handoff by token IDs or KV, DRC
  router     the client-facing role: route decision, one ordered stream per request
  client     helpers to call the router and wait for health (tests, benchmarks)

Below them, workers/kvwire moves KV on its own TCP data plane; the roles pass it their settings
(config.PathConfig.send_settings) and their event log (an EventSink).

Run a role: python -m workers.roles.<router|prefill|decode> --config cfg.yaml [--worker NAME]
"""

# The module that runs each role (python -m <module> --config FILE --worker NAME): every runtime starts them so.
ROLE_MODULES = {
    "router": "workers.roles.router",
    "p": "workers.roles.prefill",
    "rld": "workers.roles.decode",
    "md": "workers.roles.decode",
}
START_ORDER = ("md", "rld", "p", "router")  # the router last: it dials the others
