"""Networks of the framework (plain ``torch.nn`` modules; no Lightning, no device strings, no I/O).

Submodules are imported explicitly (``from animegamer.models.frozen_encoders import ...``) so that
importing this package stays cheap: transformers and diffusers load only where they are used.
"""
