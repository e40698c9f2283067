"""Edge FX graph -> etmlx MLX graph IR: rules per op family, and the backend's preprocess."""
