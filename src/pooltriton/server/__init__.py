"""Host-side server tools: the backend directory Triton loads, and the tritonserver launcher."""
