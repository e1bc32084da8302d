"""The core every package shares, importing nothing of the repository: the event and control-record
contracts (events, control, tool_format), where things live (paths), process handling (procs and its
group_guard), the gateway admin client, topic creation and progress bars. Everything else in `flywheel`
(the command line, the demo, the local fleet, the development broker launcher) is the top layer, which may
import any package; nothing here or in serving, online_rl, weight_sync or kernels imports it
(tests/unit/test_import_layers.py)."""
