"""An evaluation's pre-flight: the exports it scores (their roles, sizes, held-out split and clip size),
its output folder, the benchmark file, the data it plays, the judge, the models' settings and the game's
batching, every problem at once, before any model loads. ``evaluate.py`` and the recipes compose it.
"""
from __future__ import annotations

from pathlib import Path

from animegamer.checkpoints.export import export_folder_problems, recorded_start
from animegamer.checkpoints.export_checks import check_export_role, check_export_sizes
from animegamer.config.disk_checks import check_weight_folders
from animegamer.config.validate import ConfigError, check_encoders, check_seeds
from animegamer.contracts.files import EXPORT_FILE, MANIFEST, TRAINED_FILE
from animegamer.data.lineage import stale_folder_problems
from animegamer.data.split_checks import captions_problems, counts_of, held_out_problems
from animegamer.data.storage import is_url
from animegamer.data.trained_data import clip_size_problems, split_problems
from animegamer.diffusion.cfg_parallel import check_cfg_parallel
from animegamer.diffusion.step_cache import check_sampling_cache
from animegamer.evaluation.benchmark import benchmark_file_problems
from animegamer.evaluation.judge import check_judge
from animegamer.game.scheduler import check_batch_games
from animegamer.utils.io import out_dir_problem
from animegamer.models.checks import check_attention, check_tokenizer
from animegamer.models.decoder import check_decoder_compile
from animegamer.models.fp8 import check_decoder_fp8
from animegamer.models.mllm import check_mllm


def validate_eval_run(cfg) -> None:
    """Exports, shards and the model sizes an evaluation needs, all checked before anything loads."""
    problems = check_evaluation(cfg)
    if problems:
        raise ConfigError(problems)


def check_evaluation(cfg, made: bool = True) -> list[str]:
    """Every problem of an evaluation config. ``made`` False: its exports and data are made later (a recipe
    checking its evaluation before its first stage): only its settings and the files it is given."""
    e = cfg.evaluation
    problems = check_seeds(cfg)
    if made:
        for key in ("mllm_export", "renderer_export"):
            path = getattr(e, key)
            problems += export_folder_problems(f"evaluation.{key}={path!r}", path, hint="train the phase first")
        if e.reconstruction_export:
            problems += export_folder_problems(f"evaluation.reconstruction_export={e.reconstruction_export!r}",
                                               e.reconstruction_export, "not a phase (a) export folder")
    out_problem = out_dir_problem(e.out)
    if out_problem:
        problems.append(f"evaluation.out={e.out!r}: {out_problem}; choose another output folder")
    if e.benchmark:
        problems += benchmark_file_problems(e.benchmark)  # its game ids become folders under evaluation.out
    root, local = Path(cfg.data.root), not is_url(str(cfg.data.root))
    if not local:  # the games are played from local clips and sessions
        problems.append(f"data.root={cfg.data.root!r}: an evaluation reads its clips and session shards from a local "
                        f"folder, not a URL; copy the pipeline output here and name that folder")
    for folder in (cfg.data.clips, cfg.data.sessions) if made and local else ():
        if not (root / folder / MANIFEST).exists():
            problems.append(f"{root / folder}/manifest.json: missing; run the pipeline first")
        else:
            problems += stale_folder_problems(root, root / folder)
    if e.games <= 0 or e.turns <= 0:
        problems.append("evaluation.games and evaluation.turns must be > 0")
    problems += check_batch_games("evaluation.batch_games", e.batch_games)
    problems += check_judge(e.judge)
    problems += check_mllm(cfg.model) + check_encoders(cfg.model.encoders, ("vae",)) + check_attention(cfg.model)
    problems += check_decoder_compile(cfg.model.decoder, training=False) + check_decoder_fp8(cfg.model.decoder)
    problems += check_cfg_parallel(cfg.model.decoder) + check_sampling_cache(cfg.model.diffusion, cfg.model.decoder)
    problems += check_tokenizer(cfg.model, [("evaluation.mllm_export", e.mllm_export)])
    problems += check_weight_folders(cfg.model, ("mllm", "decoder", "vae"))
    if not made:
        return problems
    for key, role in (("mllm_export", "mllm"), ("renderer_export", "renderer"), ("reconstruction_export", "renderer")):
        role_problems = check_export_role(f"evaluation.{key}", getattr(e, key), role)
        problems += role_problems or check_export_sizes(f"evaluation.{key}", getattr(e, key), cfg.model)
    problems += check_evaluated_exports(cfg, ("mllm_export", "renderer_export", "reconstruction_export"))
    if not e.benchmark and (root / cfg.data.clips / MANIFEST).exists():
        problems += evaluation_problems(cfg)
    problems += untrained_game_problems(cfg)
    return problems


def check_evaluated_exports(cfg, keys: tuple[str, ...]) -> list[str]:
    """The held-out split and clip size each evaluated export was trained with, against this evaluation's."""
    exports = [(f"evaluation.{key}", getattr(cfg.evaluation, key)) for key in keys]
    renderers = [(k, f) for k, f in exports if not k.endswith("mllm_export")]
    return split_problems(cfg, exports) + clip_size_problems(cfg, renderers)


def evaluation_problems(cfg, trained: bool = True) -> list[str]:
    """What an evaluation needs from its data: captioned clips of held-out shots to play. ``trained``: its
    exports are already trained (False: checked before the recipe trains them, with the same split)."""
    c = counts_of(cfg)
    return captions_problems(c) + held_out_problems(c, "evaluation", trained)


def untrained_game_problems(cfg) -> list[str]:
    """``evaluation.untrained_game`` needs the phase (b) start its MLLM export records to exist."""
    e = cfg.evaluation
    if not e.untrained_game or not e.mllm_export:
        return []
    _, init = recorded_start(e.mllm_export)
    return [f"evaluation.untrained_game: {e.mllm_export}/{EXPORT_FILE} records phase.init_from={path!r}, "
            "not an export folder (the untrained game starts where phase (b) started)"
            for path in init if not (Path(path) / TRAINED_FILE).is_file()]
