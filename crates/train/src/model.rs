//! The MLP: three linear layers with ReLU, softmax cross-entropy, Adam.
//! Every tensor lives in `snapdiff-runtime` buffers.

use rand::SeedableRng;
use rand::rngs::SmallRng;
use snapdiff_runtime::{AllocError, Allocator, Stream};

use crate::compute::{AdamStep, Compute};
use crate::data::normal;
use crate::tensor::Tensor;

/// A parameter and its Adam moments.
struct Param {
    value: Tensor,
    /// Adam's moments, allocated at the first update (once: not a leak).
    moments: Option<(Tensor, Tensor)>,
}

/// The network's shape.
#[derive(Clone, Copy, Debug)]
pub struct Shape {
    /// Input features.
    pub inputs: usize,
    /// Units of each hidden layer.
    pub hidden: usize,
    /// Output classes.
    pub classes: usize,
}

/// What a forward pass leaves for the backward pass and the caller.
pub struct Forward {
    /// The batch.
    pub x: Tensor,
    /// First hidden layer's activations.
    pub h1: Tensor,
    /// Second hidden layer's activations.
    pub h2: Tensor,
    /// Output logits.
    pub logits: Tensor,
}

/// The multi-layer perceptron.
pub struct Mlp {
    shape: Shape,
    /// w1, b1, w2, b2, w3, b3.
    params: Vec<Param>,
}

impl Mlp {
    /// A network with random initial weights.
    pub fn new(
        alloc: &Allocator,
        compute: &dyn Compute,
        shape: Shape,
        seed: u64,
    ) -> Result<Mlp, AllocError> {
        let mut rng = SmallRng::seed_from_u64(seed);
        let Shape {
            inputs,
            hidden,
            classes,
        } = shape;
        let dims = [
            (inputs, hidden),
            (1, hidden),
            (hidden, hidden),
            (1, hidden),
            (hidden, classes),
            (1, classes),
        ];
        let mut params = Vec::new();
        for (i, &(rows, cols)) in dims.iter().enumerate() {
            let mut value = Tensor::new(alloc.alloc(4 * rows * cols, Stream::DEFAULT)?, rows, cols);
            let fan_in = dims[i - i % 2].0 as f32;
            let init: Vec<f32> = if i % 2 == 1 {
                vec![0.0; rows * cols]
            } else {
                (0..rows * cols)
                    .map(|_| normal(&mut rng) * (2.0 / fan_in).sqrt())
                    .collect()
            };
            compute.upload(&mut value, &init);
            params.push(Param {
                value,
                moments: None,
            });
        }
        Ok(Mlp { shape, params })
    }

    /// The forward pass over a batch `x` (rows x inputs).
    pub fn forward(
        &self,
        alloc: &Allocator,
        compute: &dyn Compute,
        x: Tensor,
    ) -> Result<Forward, AllocError> {
        let rows = x.rows;
        let p = &self.params;
        let mut h1 = Tensor::new(
            alloc.alloc(4 * rows * self.shape.hidden, Stream::DEFAULT)?, // leaks with --leak keep-activations
            rows,
            self.shape.hidden,
        );
        compute.matmul(&x, false, &p[0].value, false, &mut h1);
        compute.add_bias(&mut h1, &p[1].value, true);
        let mut h2 = Tensor::new(
            alloc.alloc(4 * rows * self.shape.hidden, Stream::DEFAULT)?,
            rows,
            self.shape.hidden,
        );
        compute.matmul(&h1, false, &p[2].value, false, &mut h2);
        compute.add_bias(&mut h2, &p[3].value, true);
        let mut logits = Tensor::new(
            alloc.alloc(4 * rows * self.shape.classes, Stream::DEFAULT)?,
            rows,
            self.shape.classes,
        );
        compute.matmul(&h2, false, &p[4].value, false, &mut logits);
        compute.add_bias(&mut logits, &p[5].value, false);
        Ok(Forward { x, h1, h2, logits })
    }

    /// Per-example losses against `labels`, and their mean's gradient with
    /// respect to the logits.
    pub fn loss(
        &self,
        alloc: &Allocator,
        compute: &dyn Compute,
        fwd: &Forward,
        labels: &Tensor,
    ) -> Result<(Tensor, Tensor), AllocError> {
        let rows = fwd.logits.rows;
        let mut losses = Tensor::new(
            alloc.alloc(4 * rows, Stream::DEFAULT)?, // leaks with --leak accumulate-loss
            rows,
            1,
        );
        let mut dlogits = Tensor::new(
            alloc.alloc(4 * rows * self.shape.classes, Stream::DEFAULT)?,
            rows,
            self.shape.classes,
        );
        compute.softmax_xent(&fwd.logits, labels, &mut losses, &mut dlogits);
        Ok((losses, dlogits))
    }

    /// Back-propagates `dlogits` and takes one Adam step.
    pub fn backward_and_update(
        &mut self,
        alloc: &Allocator,
        compute: &dyn Compute,
        fwd: &Forward,
        dlogits: Tensor,
        adam: AdamStep,
    ) -> Result<(), AllocError> {
        let Shape {
            inputs,
            hidden,
            classes,
        } = self.shape;
        let rows = fwd.x.rows;
        let p = &self.params;
        // Gradients live for this step only, as PyTorch's do with zero_grad(set_to_none=True).
        let mut g = Vec::with_capacity(6);
        let mut dw3 = Tensor::new(
            alloc.alloc(4 * hidden * classes, Stream::DEFAULT)?,
            hidden,
            classes,
        );
        compute.matmul(&fwd.h2, true, &dlogits, false, &mut dw3);
        let mut db3 = Tensor::new(alloc.alloc(4 * classes, Stream::DEFAULT)?, 1, classes);
        compute.col_sum(&dlogits, &mut db3);
        let mut dh2 = Tensor::new(
            alloc.alloc(4 * rows * hidden, Stream::DEFAULT)?,
            rows,
            hidden,
        );
        compute.matmul(&dlogits, false, &p[4].value, true, &mut dh2);
        compute.relu_backward(&mut dh2, &fwd.h2);
        let mut dw2 = Tensor::new(
            alloc.alloc(4 * hidden * hidden, Stream::DEFAULT)?,
            hidden,
            hidden,
        );
        compute.matmul(&fwd.h1, true, &dh2, false, &mut dw2);
        let mut db2 = Tensor::new(alloc.alloc(4 * hidden, Stream::DEFAULT)?, 1, hidden);
        compute.col_sum(&dh2, &mut db2);
        let mut dh1 = Tensor::new(
            alloc.alloc(4 * rows * hidden, Stream::DEFAULT)?,
            rows,
            hidden,
        );
        compute.matmul(&dh2, false, &p[2].value, true, &mut dh1);
        compute.relu_backward(&mut dh1, &fwd.h1);
        let mut dw1 = Tensor::new(
            alloc.alloc(4 * inputs * hidden, Stream::DEFAULT)?,
            inputs,
            hidden,
        );
        compute.matmul(&fwd.x, true, &dh1, false, &mut dw1);
        let mut db1 = Tensor::new(alloc.alloc(4 * hidden, Stream::DEFAULT)?, 1, hidden);
        compute.col_sum(&dh1, &mut db1);
        g.extend([dw1, db1, dw2, db2, dw3, db3]);
        for (param, grad) in self.params.iter_mut().zip(&g) {
            if param.moments.is_none() {
                let (rows, cols) = (param.value.rows, param.value.cols);
                let mut m = Tensor::new(alloc.alloc(4 * rows * cols, Stream::DEFAULT)?, rows, cols);
                let mut v = Tensor::new(alloc.alloc(4 * rows * cols, Stream::DEFAULT)?, rows, cols);
                let zeros = vec![0.0; rows * cols];
                compute.upload(&mut m, &zeros);
                compute.upload(&mut v, &zeros);
                param.moments = Some((m, v));
            }
            let (m, v) = param.moments.as_mut().expect("allocated above");
            compute.adam(&mut param.value, grad, m, v, adam);
        }
        Ok(())
    }
}
