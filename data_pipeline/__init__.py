"""The offline clip-and-caption pipeline: films in, webdataset clip shards (and features, sessions) out.

Stages, each a small module: ``ingest`` (probe), ``shots`` (PySceneDetect), ``clips`` (windows, frame
sampling, resize/crop, mp4), ``motion`` (optical-flow motion scope), ``captioners`` (captions and
states), ``writer`` (shards, manifest, report), ``precompute`` (frozen-encoder features) and
``sessions`` (multi-turn session index). ``run`` wires them with restartable, parallel execution.
"""
