//! The synthetic task: classify Gaussian points as a fixed random "teacher"
//! network does. A student MLP of the same shape can learn it, so the loss
//! falls step after step.

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

/// Generates batches: inputs, and the teacher's labels for them.
pub struct Teacher {
    rng: SmallRng,
    inputs: usize,
    classes: usize,
    /// The teacher's weights, `inputs` x `classes`.
    weights: Vec<f32>,
}

/// A standard normal sample (Box-Muller).
pub(crate) fn normal(rng: &mut SmallRng) -> f32 {
    let u1: f32 = rng.random_range(f32::EPSILON..1.0);
    let u2: f32 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f32::consts::PI * u2).cos()
}

impl Teacher {
    /// A teacher for `inputs`-dimensional points and `classes` classes.
    pub fn new(seed: u64, inputs: usize, classes: usize) -> Teacher {
        let mut rng = SmallRng::seed_from_u64(seed);
        let weights = (0..inputs * classes).map(|_| normal(&mut rng)).collect();
        Teacher {
            rng,
            inputs,
            classes,
            weights,
        }
    }

    /// A batch of `rows` points (row-major) and their labels.
    pub fn batch(&mut self, rows: usize) -> (Vec<f32>, Vec<f32>) {
        let x: Vec<f32> = (0..rows * self.inputs)
            .map(|_| normal(&mut self.rng))
            .collect();
        let labels = (0..rows)
            .map(|r| {
                let point = &x[r * self.inputs..(r + 1) * self.inputs];
                let score = |c: usize| -> f32 {
                    point
                        .iter()
                        .enumerate()
                        .map(|(i, v)| v * self.weights[i * self.classes + c])
                        .sum()
                };
                (0..self.classes)
                    .max_by(|&a, &b| score(a).total_cmp(&score(b)))
                    .unwrap_or(0) as f32
            })
            .collect();
        (x, labels)
    }
}
