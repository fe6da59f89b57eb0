"""The bundled demo inference server: a real small model behind an OpenAI-style API.

Importing this package is cheap: torch and transformers load only when a
server starts (demo.model), so the load generator and the CLI help work
without them.
"""
