"""Triton's Python stub command line, as the stages (the admission board's name) and the server's
supervisor (which stub serves which instance) read it: the stub, the model's path, its shared-memory
region (the server's prefix + a 36-character UUID), sizes, the server's pid, ..., the instance name."""

STUB = "triton_python_backend_stub"
SHM_ARG, SERVER_PID_ARG, INSTANCE_ARG = 2, 5, 8
