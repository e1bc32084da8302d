"""In-place weight patches, one home for both ends: the patch a weight agent writes and the SGLang custom weight loader
that applies it inside the replica.

- `format`: In-place weight patches: what a weights agent hands the SGLang engine next to it, instead of a whole
  checkpoint to re-read.
- `loader`: SGLang custom weight loader (`--custom-weight-loader weight_patch.loader.apply`): apply a weight patch
  (weight_patch.format) to the served model in place, element by element where few changed: their XOR with the base,
  applied only where the model holds the base bits the patch names (so never to another version, never twice), with
  a fused loop on a CPU (kernels.delta.xor_scatter), tensors side by side.
- `writer`: Writing a weight patch (weight_patch.format): the file a weights agent lays down for the SGLang loader
  next to it (weight_patch.loader) to apply.
- `reader`: A patch read back with numpy, entry by entry: what the weight agent does to persist a version it handed
  the replica in place (weight_sync.agent.inplace.persist).
"""
