"""How a front end reaches engine cores: in-process, in a thread, in child processes, and over data-parallel cores."""
