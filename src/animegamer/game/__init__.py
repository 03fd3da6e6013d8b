"""The playable game loop: instruction in, clip and character states out.

Per turn:

1. the game-state MLLM reads the sliding window of past turns (at most ``window_turns - 1`` of them, each
   with its instruction, its predicted states and its predicted representation) and the new
   instruction, and predicts the turn's states (ML, SC, ET, ST) and representation (N, D);
2. the motion level ML becomes a motion-scope flow value through the clip manifest's
   ``motion_bins.level_flow`` (the flow the training data's clips of that level had);
3. the decoder samples the clip's latents from the representation (DPM++, dynamic CFG; the
   unconditional branch is the encoder on zero text and image features), seeded by (seed, turn);
4. the VAE decodes them into frames;
5. the character states move: ``value = clamp(value + 5 * delta, 0, 100)`` for SC, ET and ST, starting
   at 50 (the official demo).

A malformed state generation is an error (``ValueError`` naming the turn), never default states.

Command line::

    python -m animegamer.game --mllm EXPORT --renderer EXPORT [--renderer EXPORT] --clips-manifest MANIFEST \\
        --instructions FILE.txt --out DIR [hydra overrides ...]
    python -m animegamer.game ... --interactive --out DIR      # instructions from stdin, one per line
    python -m animegamer.game ... --max-turns 3 --window-turns 2   # play 3 turns; the MLLM sees 1 past turn

``--max-turns`` limits the turns played (default: every instruction); ``--window-turns`` is the MLLM's
window, the new turn included (default K). A wrong path or override exits with code 2 and a message.

The output folder holds ``turn_000.mp4``, ``turn_001.mp4``, ..., ``game.json`` (the full log) and
``index.html`` (a storyboard), rewritten after every turn.

The modules: ``state`` (the character states and a played turn's record), ``turns`` (one game and one turn
of several games played as a batch), ``render`` (sampling and decoding a batch of turns), ``writer`` (the
output folder), ``scheduler`` (whole games, several advancing together), ``models`` (what a turn runs,
loaded from the exports), ``html`` (the storyboard page), ``preflight`` (the command's input checks) and
``cli`` (the command line).
"""
