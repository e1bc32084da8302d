"""Test hosts (`flywheel hosts`): network namespaces on one bridge, a fleet laid over them, and HAProxy in front of
several gateways.

- `cli`: `flywheel hosts up N | list | down K | down --all`: test hosts (flywheel.hosts.netns) on this machine.
- `fleet`: A fleet laid over test hosts (flywheel.hosts.netns): what runs where when Flywheel outgrows one machine.
- `haproxy`: HAProxy in front of several gateways: what IDE clients reach when one gateway process is not enough.
- `netns`: Test hosts: N network namespaces on one bridge, so a fleet can be laid over "machines" that talk by
  address, on this one machine (`flywheel hosts up N`; in tests, `with TestHosts.up(...) as hosts`).
"""
