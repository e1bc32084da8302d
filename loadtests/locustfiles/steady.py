"""steady: IDE traffic and nothing else; the baseline the other scenarios are held to.
Pass: zero failed requests; p99 of the later part of the run within the allowed multiple of the first."""

from loadtests.ide_users import AgentUser, AutocompleteUser, ChatUser  # noqa: F401  (the users locust runs)
