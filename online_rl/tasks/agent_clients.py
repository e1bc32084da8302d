"""How the agent clients people run look to the model, for the bootstrap corpus: their tools, their shell's
answers and the context they send around a user's request.

Codex CLI and Claude Code do not offer `read_file` / `write_file` / `run_tests`: they offer a shell
(`exec_command(cmd)`, `Bash(command)`) among tools of their own (Read, Write, apply_patch, write_stdin,
...), thousands of tokens of system prompt first, an environment block and reminders around the user's
words. An episode in a client's style does the same work as a Flywheel one (read the file, write it, run its
tests, answer) through that client's shell:

    <tool_call> {"name": "exec_command", "arguments": {"cmd": "cat app.py"}} </tool_call>
    <tool_call> {"name": "exec_command", "arguments": {"cmd": "cat > app.py << 'EOF'\\n...\\nEOF"}} </tool_call>
    <tool_call> {"name": "exec_command", "arguments": {"cmd": "python3 test_app.py"}} </tool_call>

The toolsets are the clients' own shapes (names, argument names and types, in their order; measured from
Codex 0.171.0 and Claude Code 2.1.332, docs/agent-clients.md) with descriptions of our own wording, 42% each, plus
variants
(other shell names and argument names, distractor tools in any order; 16%) so that the model reads which
tool is the shell from the list it is given (measured: at 30% variants the agent model named a shell the
client did not offer in most of its calls; the tools now come right before its turn too). The prose is real
English (this Python's standard library docstrings) among synthetic instructions: the model learns to read past
a long system prompt to the tools and the request, whatever it says.
"""

from __future__ import annotations

import ast
import functools
import random
import sysconfig
from dataclasses import dataclass
from pathlib import Path

STR, NUM, BOOL = {"type": "string"}, {"type": "number"}, {"type": "boolean"}


def _tool(name: str, description: str, props: dict, required: list[str]) -> dict:
    return {
        "name": name,
        "description": description,
        "parameters": {"type": "object", "properties": props, "required": required},
    }


# The clients' shells, as they offer them: (tool, its command argument).
CLAUDE_BASH = _tool(
    "Bash",
    "Executes a bash command and returns its output.",
    {"command": STR, "timeout": NUM, "description": STR, "run_in_background": BOOL, "dangerouslyDisableSandbox": BOOL},
    ["command"],
)
CODEX_EXEC = _tool(
    "exec_command",
    "Runs a command in a PTY, returning output or a session ID for ongoing interaction.",
    {
        "cmd": STR,
        "justification": STR,
        "login": BOOL,
        "max_output_tokens": NUM,
        "prefix_rule": {"type": "array"},
        "sandbox_permissions": STR,
        "shell": STR,
        "tty": BOOL,
        "workdir": STR,
        "yield_time_ms": NUM,
    },
    ["cmd"],
)
OTHER_SHELLS = (("shell", "command"), ("run_command", "command"), ("bash", "cmd"), ("terminal", "command"))
SHELL_WORDS = ("Runs a shell command and returns its output.", "Execute a command in the workspace.", "")

# Tools the clients offer beside their shell (never called in these episodes: the model learns to pick).
DISTRACTORS = (
    _tool(
        "Read",
        "Reads a file from the local filesystem.",
        {
            "file_path": STR,
            "offset": {"type": "integer"},
            "limit": {"type": "integer"},
            "pages": STR,
            "allow_large": BOOL,
        },
        ["file_path"],
    ),
    _tool(
        "Write",
        "Writes a file to the local filesystem, overwriting if one exists.",
        {"file_path": STR, "content": STR},
        ["file_path", "content"],
    ),
    _tool(
        "Edit",
        "Replaces text in a file.",
        {"file_path": STR, "old_string": STR, "new_string": STR, "replace_all": BOOL},
        ["file_path", "old_string", "new_string"],
    ),
    _tool("DeferredToolPlaceholder", "Reserved placeholder; never call this tool.", {}, []),
    _tool(
        "write_stdin",
        "Writes characters to an existing exec session and returns recent output.",
        {"chars": STR, "max_output_tokens": NUM, "session_id": NUM, "yield_time_ms": NUM},
        ["session_id"],
    ),
    _tool("apply_patch", "Edits files with a patch. This is a FREEFORM tool.", {"input": STR}, ["input"]),
    _tool("Glob", "Finds files by name pattern.", {"pattern": STR, "path": STR}, ["pattern"]),
    _tool("Grep", "Searches file contents with a regular expression.", {"pattern": STR, "path": STR}, ["pattern"]),
    _tool("update_plan", "Updates the task plan.", {"explanation": STR, "plan": {"type": "array"}}, ["plan"]),
    _tool("view_image", "Attach a local image to the conversation.", {"path": STR}, ["path"]),
)
CLAUDE_SET = ("Bash", "Read", "DeferredToolPlaceholder", "Write")  # `claude --tools Read,Write,Bash`
CODEX_SET = ("exec_command", "write_stdin", "apply_patch")  # codex exec, hosted tools off


@dataclass(frozen=True)
class Shell:
    """An episode's toolset in a client's style: the tools in the order offered, and which is the shell."""

    tools: tuple[dict, ...]
    name: str  # the shell tool
    arg: str  # its command argument
    style: str  # how the shell's output comes back: "plain" (Claude Code) or "codex" (a header first)

    def call(self, command: str) -> tuple[str, dict]:
        return self.name, {self.arg: command}


def client_shell(rng: random.Random) -> Shell:
    """A toolset: Claude Code's or Codex's as they send it, or a variant (another shell, other tools)."""
    r = rng.random()
    by_name = {t["name"]: t for t in DISTRACTORS + (CLAUDE_BASH, CODEX_EXEC)}
    if r < 0.42:
        return Shell(tuple(by_name[n] for n in CLAUDE_SET), "Bash", "command", "plain")
    if r < 0.84:
        return Shell(tuple(by_name[n] for n in CODEX_SET), "exec_command", "cmd", "codex")
    name, arg = rng.choice(OTHER_SHELLS + (("Bash", "command"), ("exec_command", "cmd")))
    shell = _tool(name, rng.choice(SHELL_WORDS), {arg: STR, **({"timeout": NUM} if rng.random() < 0.5 else {})}, [arg])
    tools = [shell] + rng.sample(DISTRACTORS, rng.randint(0, 4))
    rng.shuffle(tools)
    return Shell(tuple(tools), name, arg, rng.choice(("plain", "codex")))


def shell_output(shell: Shell, out: str, code: int, rng: random.Random) -> str:
    """What the client sends back for a command's output (exit code `code`)."""
    if shell.style == "codex":
        head = f"Chunk ID: {rng.getrandbits(24):06x}\nWall time: {rng.uniform(0.01, 0.4):.4f} seconds\n"
        return f"{head}Process exited with code {code}\nOriginal token count: {max(1, len(out) // 4)}\nOutput:\n{out}"
    return out if out else rng.choice(("", "(No output)", "(Bash completed with no output)"))


def heredoc(path: str, content: str) -> str:
    return f"cat > {path} << 'EOF'\n{content.rstrip(chr(10))}\nEOF"


def test_file(path: str) -> str:
    return f"test_{path}"


# ----------------------------------------------------------------------------- the context around a request

_OPEN = ("You are", "Act as", "You work as")
_ROLE = ("a coding agent", "a careful software engineer", "an assistant for programmers", "a terminal coding tool")
_VERB = ("Keep", "Prefer", "Avoid", "Use", "Check", "Explain", "Follow", "Read", "Write", "Ask about", "Report")
_THING = (
    "answers short",
    "small focused changes",
    "the existing code style",
    "the tools you are given",
    "tests before and after a change",
    "destructive commands",
    "what you changed and why",
    "the user's instructions",
    "files before editing them",
    "clear commit messages",
    "secrets and credentials",
    "long explanations",
    "the project's conventions",
    "unrelated refactors",
)
_WHEN = (
    "at all times",
    "unless the user asks otherwise",
    "when it helps the user",
    "before you finish",
    "whenever you can",
    "in every answer",
    "",
)
_HEAD = ("# Tone", "# Tools", "## Editing files", "## Testing", "# Safety", "## Git", "# Output format", "## Planning")
_TAGS = ("permissions instructions", "system-reminder", "collaboration_mode", "skills", "user_instructions")
# Common words of instructions to a coding agent: the prose's filler, so that the tokenizer and the model meet
# English words rather than a handful repeated.
_WORDS = tuple(
    (
        "the a an and or but if when while because before after until unless so then also only never always "
        "often usually should must may might can could would will do does did not no yes every each any all "
        "some most user users agent model tool tools file files folder directory path paths command commands "
        "shell terminal output input error errors warning warnings test tests code change changes diff patch "
        "commit branch repository project workspace sandbox network approval permission permissions request "
        "requests response answer question task tasks plan step steps goal result results review reviewer "
        "message messages session context instructions guidance rule rules policy safety secret secrets key "
        "keys token tokens limit limits time date format markdown heading list bullet example examples note "
        "notes summary details reason reasons explanation behavior style tone voice clear concise short long "
        "brief careful precise direct friendly helpful honest useful safe correct complete read write edit "
        "create delete move rename search find open close run execute install build check verify confirm ask "
        "tell show explain describe report mention keep avoid prefer use follow respect stop continue start "
        "finish begin end handle fix update improve remove add include exclude return print log save load "
        "your you we our their this that these those it its there here what which who how why where important "
        "required optional default current previous next first last new old other same different function "
        "class module package library dependency dependencies version versions configuration setting settings "
        "environment variable variables server client api endpoint http url browser image images git github "
        "pull push merge rebase status staged unstaged tracked ignored history logs "
    ).split()
)


def _sentence(rng: random.Random) -> str:
    r = rng.random()
    if r < 0.15:
        return f"{rng.choice(_OPEN)} {rng.choice(_ROLE)}."
    if r < 0.7:
        when = rng.choice(_WHEN)
        return f"{rng.choice(_VERB)} {rng.choice(_THING)}{' ' + when if when else ''}."
    n = rng.randint(5, 14)
    words = " ".join(rng.choice(_WORDS) for _ in range(n))
    return words[0].upper() + words[1:] + rng.choice((".", ".", ":", "?"))


@functools.lru_cache(maxsize=1)
def _docstrings() -> tuple[str, ...]:
    """Real English prose about code, on every machine: the docstrings of this Python's standard library
    (~2,000 of 200+ characters, ~1.1 MB; the same for a Python version: bootstrap's cache key has it)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    out = []
    for path in sorted(root.glob("*.py")) + sorted(root.glob("*/*.py")):
        if {"test", "tests", "idlelib", "lib2to3", "site-packages", "turtledemo"} & set(path.parts):
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= 200:
                    out.append(doc)
    return tuple(out)


def prose(rng: random.Random, chars: int) -> str:
    """A system prompt of about `chars` characters: real paragraphs (the standard library's docstrings) among
    instruction sentences, bullets, headings and tagged blocks, as agent clients write theirs."""
    docs = _docstrings()
    out: list[str] = []
    size = 0
    while size < chars:
        r = rng.random()
        if r < 0.08:
            block = rng.choice(_HEAD)
        elif r < 0.25:
            block = "\n".join(f"- {_sentence(rng)}" for _ in range(rng.randint(2, 6)))
        elif r < 0.3:
            tag = rng.choice(_TAGS)
            block = f"<{tag}>\n{' '.join(_sentence(rng) for _ in range(rng.randint(1, 4)))}\n</{tag}>"
        elif r < 0.4 or not docs:
            block = " ".join(_sentence(rng) for _ in range(rng.randint(2, 6)))
        else:
            paragraphs = rng.choice(docs).split("\n\n")
            at = rng.randrange(len(paragraphs))
            block = "\n\n".join(paragraphs[at : at + rng.randint(1, 3)])
        out.append(block)
        size += len(block) + 2
    return "\n\n".join(out)


def environment(rng: random.Random, cwd: str, style: str) -> str:
    if style == "codex":
        return (
            f"<environment_context>\n  <cwd>{cwd}</cwd>\n  <shell>bash</shell>\n"
            f"  <current_date>2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}</current_date>\n"
            "</environment_context>"
        )
    return (
        f"# Environment\nYou have been invoked in the following environment: \n - Primary working directory: {cwd}\n"
        f" - Is a git repository: {rng.choice(('true', 'false'))}\n - Platform: linux\n - Shell: bash"
    )


@dataclass(frozen=True)
class Context:
    """What a client sends around the user's request: system prompt(s) first, then (Codex) an environment
    message or (Claude Code) a reminder before the request and an environment system message after it."""

    system: tuple[str, ...] = ()
    before: str = ""  # a user message before the request (Codex's environment) or a reminder inside it
    after: str = ""  # a system message after the request (Claude Code's environment)
    reminder: bool = False  # `before` is a reminder in the same user message, not a message of its own

    def messages(self, ask: str) -> list[dict]:
        out = [{"role": "system", "content": s, "calls": []} for s in self.system]
        if self.before and not self.reminder:
            out.append({"role": "user", "content": self.before, "calls": []})
        text = f"{self.before}\n{ask}" if self.before and self.reminder else ask
        out.append({"role": "user", "content": text, "calls": []})
        if self.after:
            out.append({"role": "system", "content": self.after, "calls": []})
        return out


def client_context(rng: random.Random, style: str, max_chars: int) -> Context:
    """A context in a client's style, its system prompt up to `max_chars` characters (log-uniform: short
    and long ones alike)."""
    chars = int(round(2 ** rng.uniform(7, max(7.0, (max_chars or 128).bit_length())))) if max_chars else 0
    system = (prose(rng, chars),) if chars else ()
    cwd = "/" + "/".join(rng.choice(("tmp", "home", "work", "src", "repo", "proj")) for _ in range(rng.randint(1, 3)))
    if style == "codex":
        if system and rng.random() < 0.5:
            system += (f"<permissions instructions>\n{prose(rng, 300)}\n</permissions instructions>",)  # type: ignore[assignment]  # model code
        return Context(system, before=environment(rng, cwd, "codex") if rng.random() < 0.8 else "")
    reminder = (
        f"<system-reminder>\n{prose(rng, rng.randint(80, 500))}\n</system-reminder>" if rng.random() < 0.6 else ""
    )
    return Context(
        system, before=reminder, reminder=True, after=environment(rng, cwd, "plain") if rng.random() < 0.7 else ""
    )
