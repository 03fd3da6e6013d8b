"""Media shared by the library and the offline pipeline: mp4 encoding and decoding and frame picking
(``video``), the optical-flow estimator (``flow``), motion levels (``motion_bins``), fingerprints of
inputs and shard sets (``fingerprint``) and caption statuses (``captions``)."""
