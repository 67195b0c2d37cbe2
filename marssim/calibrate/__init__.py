"""GPU calibration: measured kernel timings for the calibrated cost models, and ``sip``
(stochastic instruction perturbation of native SASS schedules)."""
