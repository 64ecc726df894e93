use policy_ramsis::mdp::ModelSpec;

/// Reads the artifact's effective p95 table (task, action_index, model,
/// accuracy, batch_size, latency_us) for one task.
pub fn table(task: &str) -> Vec<ModelSpec> {
    let text = include_str!("../data/ramsis_effective_latency_p95_us.csv");
    let mut models: Vec<ModelSpec> = Vec::new();
    for line in text.lines().skip(1) {
        let f: Vec<&str> = line.split(',').collect();
        if f[0] != task {
            continue;
        }
        let index: usize = f[1].parse().unwrap();
        if models.len() < index {
            models.push(ModelSpec { name: f[2].to_string(), accuracy: f[3].parse().unwrap(), latency_us: Vec::new() });
        }
        models[index - 1].latency_us.push(f[5].parse().unwrap());
    }
    models
}

