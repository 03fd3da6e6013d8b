"""The test tiers: which tests are slow, named in one place.

A test is slow when it takes over about a second and a half on a quiet 2-core machine, the set-up of
the fixtures it needs included: every test that uses an expensive module or session fixture is slow
(otherwise the first fast test to need it would pay for it), and a module of such tests is named whole.
The developer's default run (``pytest -n 2``) leaves the slow tests out; CI runs every tier (see setup.cfg).
Entries are ``file::test`` (every parametrisation of the test) or a whole ``file``; a test that uses one
of :data:`SLOW_FIXTURES` is slow without an entry. A new test that takes longer belongs here:
``pytest --durations=20`` names them.
"""
from __future__ import annotations

from collections.abc import Iterable

SLOW = frozenset({
    "test_ablation_recipe.py::test_every_variant_has_a_warmup_its_sizes_fit",
    "test_ablation_recipe.py::test_table3_recipe_on_tiny_models",
    "test_ablations.py::test_ablation_runs_one_step_on_tiny_models",
    "test_all_problems.py::test_the_finetune_checks_every_stage_before_its_pipeline_runs",
    "test_all_problems.py::test_the_finetune_names_the_width_the_missing_film_and_every_bad_caption_line_at_once",
    "test_bad_inputs.py::test_bad_inputs_reported_and_skipped_good_film_unaffected",
    "test_baselines.py::test_real_evaluation_reports_every_baseline",
    "test_batched_evaluation.py",
    "test_benchmarks.py::test_attention_kernel_benchmark_scores_against_float32",
    "test_benchmarks.py::test_compile_checkpoint_probe_records_every_variant",
    "test_benchmarks.py::test_game_turn_benchmark_framework_variant_and_plain",
    "test_benchmarks.py::test_memory_points_by_list_merge_earlier_results",
    "test_benchmarks.py::test_memory_sweep_reports_no_peak_on_cpu",
    "test_benchmarks.py::test_paper_size_benchmarks_need_the_official_tokenizer_or_byte_by_name",
    "test_benchmarks.py::test_phase_a_benchmark_framework_and_plain",
    "test_benchmarks.py::test_phase_a_benchmark_passes_the_decoder_attention_to_the_framework",
    "test_benchmarks.py::test_phase_b_benchmark_packs_the_same_mixed_windows",
    "test_benchmarks.py::test_phase_b_benchmark_plain_eager_and_compiled_beside_compiled_framework",
    "test_benchmarks.py::test_strategies_driver_stops_resumes_and_reuses",
    "test_caption_failures.py::test_all_failed_captions_stop_the_run_after_writing_with_a_warning_summary",
    "test_captioners.py::test_http_secrets_reach_no_shard_manifest_report_or_log",
    "test_checkpoint_integrity.py::test_damaged_newest_checkpoint_is_set_aside_and_the_resume_matches_an_uninterrupted_run",
    "test_cli_errors.py::test_a_wrong_key_option_or_value_is_one_message_and_exit_code_2_writing_nothing",
    "test_cli_errors.py::test_hydras_own_options_still_work_beside_the_check",
    "test_config.py::test_every_experiment_composes_into_its_commands_schema",
    "test_config.py::test_help_says_how_to_call_and_lists_the_groups_without_dumping_every_key",
    "test_distributed.py::test_ddp_run_stopped_after_a_checkpoint_resumes_exactly",
    "test_distributed.py::test_the_animegamer_command_starts_its_other_ranks_too",
    "test_distributed.py::test_two_process_ddp_matches_single_process",
    "test_encoder_decoder.py::test_compiled_decoder_trains_like_eager",
    "test_evaluation.py",
    "test_faults.py::test_pipeline_killed_at_random_tasks_resumes_to_identical_shards",
    "test_faults.py::test_sigkill_at_random_steps_and_mid_checkpoint_write_resumes_exactly",
    "test_faults.py::test_a_stop_signal_saves_at_a_step_boundary_exits_with_its_code_and_resumes",
    "test_fp8.py::test_fp8_benchmark_runs_both_variants_on_cpu",
    "test_fp8_play.py::test_play_stores_exactly_the_frozen_base_weights_in_float8",
    "test_frozen_encoders.py::test_tiny_encoders_are_small_enough_for_cpu",
    "test_fsdp_gather.py::test_every_rank_ends_with_gloos_threads_joined",
    "test_fsdp_gather.py::test_rank0_gets_the_kept_weights_under_fsdps_full_state_dict_names",
    "test_fsdp_gather.py::test_the_checkpoint_resumes_through_lightnings_fsdp_loader",
    "test_fsdp_gather.py::test_the_export_from_the_gathered_state_equals_the_unsharded_models",
    "test_fsdp_gather.py::test_units_are_gathered_one_at_a_time_and_resharded",
    "test_game.py::test_command_line_user_errors_exit_with_a_message",
    "test_game.py::test_game_writes_one_clip_per_turn",
    "test_input_safety.py::test_train_py_resuming_from_a_malicious_checkpoint_exits_2_and_runs_nothing",
    "test_known_answer.py::test_ci_data_set_agrees_with_the_generators_truth",
    "test_known_answer.py::test_same_spec_gives_identical_truth_and_other_specs_differ",
    "test_known_answer.py::test_toy_vae_trains_on_the_ci_clips_and_loads_as_the_frozen_vae",
    "test_known_answer_vae_from.py::test_a_folder_trained_on_other_clips_is_refused_once_they_are_cut_before_any_feature",
    "test_known_answer_vae_from.py::test_a_good_folder_is_the_vae_of_every_stage_and_of_the_result",
    "test_learning.py",
    "test_logging.py::test_entry_points_print_expected_errors_without_a_traceback",
    "test_logging.py::test_every_lightning_line_is_printed_once_in_the_shared_format",
    "test_logging.py::test_torchao_import_notices_are_dropped_and_its_other_warnings_kept",
    "test_mllm_model.py::test_compiled_layers_match_eager",
    "test_motion_sweep.py::test_a_small_decoder_renders_the_speed_its_motion_scope_asks_for",
    "test_motion_sweep.py::test_the_evaluation_sweeps_its_reconstructions_into_metrics_and_report",
    "test_motion_sweep.py::test_the_rendered_speed_comes_from_the_motion_scope_alone",
    "test_multinode.py::test_node_killed_after_a_checkpoint_both_restart_and_resume_exactly",
    "test_multinode.py::test_two_nodes_train_like_one_process",
    "test_official_decoder.py::test_official_decoder_reproduces_golden_outputs",
    "test_pages.py",
    "test_phase_a.py::test_stage_trainables_fit_one_clip",
    "test_phase_a.py::test_tiny_model_overfits_one_clip",
    "test_phase_b.py::test_frozen_bf16_holds_the_base_in_bf16_trains_like_float32_and_resumes_exactly",
    "test_phase_b.py::test_resume_mid_run_continues_exactly",
    "test_phase_b.py::test_tiny_model_overfits_one_session",
    "test_phase_c.py::test_golden_loss_curve_with_dropout_on",
    "test_pipeline_parts.py::test_two_parts_then_finalize_equals_one_run",
    "test_pipeline_preflight.py::test_a_refused_run_keeps_the_toy_film_it_found",
    "test_pipeline_preflight.py::test_a_run_refused_after_drawing_the_toy_film_leaves_nothing",
    "test_pipeline_restart.py::test_killed_run_resumes_to_identical_shards",
    "test_profiling.py::test_pytorch_profiler_writes_a_trace_of_the_requested_steps",
    "test_real_footage.py::test_caption_edit_recaptions_without_recutting",
    "test_real_footage.py::test_clip_size_change_recomputes_clips_and_reuses_shot_plans",
    "test_real_footage.py::test_films_named_by_file_name_or_stem_are_all_captioned",
    "test_recompute.py::test_compiled_layers_recompute_with_the_thread_count_of_their_forward",
    "test_remote_shards.py::test_a_run_from_the_url_stopped_by_the_server_dying_resumes_to_the_local_runs_result",
    "test_remote_shards.py::test_validation_and_the_run_record_read_a_url_root",
    "test_run_folder.py::test_which_changes_a_resume_accepts",
    "test_safe_loading.py::test_training_needs_no_network",
    "test_throughput.py::test_a_slow_save_is_a_pause_not_a_data_wait",
    "test_throughput.py::test_throughput_rows_reach_the_csv_and_a_resume_keeps_earlier_rows",
    "test_toy_vae.py::test_training_learns_and_the_saved_folder_is_the_frozen_vae",
    "test_toyfilm.py::test_content_detector_finds_exactly_the_cuts",
    "test_toyfilm.py::test_every_level_appears_twice_with_its_speed",
    "test_toyfilm.py::test_farneback_flow_orders_the_levels",
    "test_toyfilm.py::test_same_arguments_give_identical_files",
    "test_toyfilm.py::test_variant_makes_a_different_film",
    "test_train_inference_parity.py::test_adaptation_predicts_each_clip_as_the_training_forward_on_its_window",
    "test_weak_scaling.py::test_counts_are_checked_before_anything_runs",
    "test_weak_scaling.py::test_cpu_rehearsal_two_nodes_equal_one_node_of_as_many_processes",
    "test_weak_scaling.py::test_cpu_weak_scaling_with_a_kill_and_resume_in_each_run",
})


# Fixtures that train a whole game: every test that uses one is slow, wherever it is.
SLOW_FIXTURES = frozenset({"quickstart"})


def is_slow(nodeid: str, fixtures: Iterable[str] = ()) -> bool:
    """Whether the test of ``nodeid`` (``tests/file.py::test[params]``, as pytest names it), which uses
    ``fixtures`` (their names), is slow."""
    path, _, name = nodeid.partition("::")
    file = path.rpartition("/")[2]
    return (file in SLOW or f"{file}::{name.partition('[')[0]}" in SLOW
            or not SLOW_FIXTURES.isdisjoint(fixtures))


# The files that take longest on two workers (pytest --durations, their tests and fixtures together), longest
# first: they are handed out first, so that no worker is left running one of them while the other has
# finished (xdist hands files out in collection order under --no-loadscope-reorder, setup.cfg). A file that
# grows long belongs here; the order within the rest of the files does not matter.
LONGEST_FIRST = (
    "test_benchmarks.py", "test_trained_data.py", "test_weak_scaling.py", "test_mllm_model.py", "test_learning.py",
    "test_recompute.py", "test_motion_sweep.py", "test_encoder_decoder.py", "test_distributed.py",
    "test_quickstart_finetune.py", "test_real_footage_finetune.py", "test_multinode.py", "test_cli_errors.py",
    "test_ablation_recipe.py", "test_quickstart.py", "test_pipeline_parts.py", "test_evaluation.py",
    "test_faults.py", "test_known_answer.py", "test_known_answer_vae_from.py", "test_toy_vae.py",
)


def schedule_rank(nodeid: str) -> int:
    """Where the test's file comes in the hand-out: by :data:`LONGEST_FIRST`, then every other file."""
    file = nodeid.partition("::")[0].rpartition("/")[2]
    return LONGEST_FIRST.index(file) if file in LONGEST_FIRST else len(LONGEST_FIRST)
