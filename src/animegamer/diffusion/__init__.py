"""The decoder's diffusion process: CogVideoX's noise schedule, training loss and sampler.

- ``schedule``: the zero-terminal-SNR, SNR-shifted, v-prediction DDPM of CogVideoX-2B, built with
  diffusers' own CogVideoX schedulers so that training and sampling read the same ``alpha_bar``.
- ``loss``: forward noising, velocity targets and CogVideoX's x0-space loss with weight 1/(1-alpha_bar).
- ``sampler``: DPM++ (2M SDE, diffusers' ``CogVideoXDPMScheduler``) with dynamic classifier-free guidance.

Submodules are imported explicitly (``from animegamer.diffusion.loss import ...``) so that importing
this package stays cheap: diffusers loads only where a scheduler is built.
"""
