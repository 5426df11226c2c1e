"""The `medtpe` command: one click group (`main`, the console script's entry point), each
layer's subcommands in a module of their own (`*_commands`), the options they share; each
command imports the layers it runs inside itself. `command_line` gives the argument list of a
command run in a child process (tests, benchmarks)."""

__all__ = ["command_line", "main"]
