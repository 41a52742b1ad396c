// Kernels of the snapdiff-train MLP, compiled at run time with NVRTC.
//
// Every tensor is a row-major float matrix in memory that snapdiff-runtime's
// caching allocator handed out; labels are floats holding class indices.
// The CPU path in crates/train/src/compute.rs computes the same math and is
// the reference the CUDA path is tested against.

extern "C" __global__ void matmul(const float* a, const float* b, float* out,
                                  int m, int k, int n, int trans_a, int trans_b) {
    // out[m x n] = op(a)[m x k] * op(b)[k x n], op = transpose when asked.
    int row = blockIdx.y * blockDim.y + threadIdx.y;
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= m || col >= n) return;
    float acc = 0.0f;
    for (int i = 0; i < k; ++i) {
        float x = trans_a ? a[i * m + row] : a[row * k + i];
        float y = trans_b ? b[col * k + i] : b[i * n + col];
        acc += x * y;
    }
    out[row * n + col] = acc;
}

extern "C" __global__ void add_bias(float* x, const float* bias, int rows, int cols, int relu) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= rows * cols) return;
    float v = x[i] + bias[i % cols];
    x[i] = (relu && v < 0.0f) ? 0.0f : v;
}

extern "C" __global__ void relu_backward(float* grad, const float* activation, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n && activation[i] <= 0.0f) grad[i] = 0.0f;
}

// Per row: loss = logsumexp(logits) - logits[label]; grad = (softmax - onehot) / rows.
extern "C" __global__ void softmax_xent(const float* logits, const float* labels, float* losses,
                                        float* grad, int rows, int cols) {
    int r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= rows) return;
    const float* z = logits + r * cols;
    float max = z[0];
    for (int c = 1; c < cols; ++c) max = fmaxf(max, z[c]);
    float sum = 0.0f;
    for (int c = 0; c < cols; ++c) sum += expf(z[c] - max);
    int label = (int)labels[r];
    losses[r] = logf(sum) + max - z[label];
    for (int c = 0; c < cols; ++c) {
        float p = expf(z[c] - max) / sum;
        grad[r * cols + c] = (p - (c == label ? 1.0f : 0.0f)) / rows;
    }
}

extern "C" __global__ void col_sum(const float* x, float* out, int rows, int cols) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float acc = 0.0f;
    for (int r = 0; r < rows; ++r) acc += x[r * cols + c];
    out[c] = acc;
}

extern "C" __global__ void adam(float* param, const float* grad, float* m, float* v, int n,
                                float lr, float beta1, float beta2, float eps, float bias1, float bias2) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    float g = grad[i];
    m[i] = beta1 * m[i] + (1.0f - beta1) * g;
    v[i] = beta2 * v[i] + (1.0f - beta2) * g * g;
    float mhat = m[i] / bias1;
    float vhat = v[i] / bias2;
    param[i] -= lr * mhat / (sqrtf(vhat) + eps);
}

// out[c] = decay * prev[c] + (1 - decay) * mean over rows of x[., c] (prev may be null).
extern "C" __global__ void ema_rows(const float* prev, const float* x, float* out, int rows, int cols,
                                    float decay) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= cols) return;
    float mean = 0.0f;
    for (int r = 0; r < rows; ++r) mean += x[r * cols + c];
    mean /= rows;
    out[c] = prev ? decay * prev[c] + (1.0f - decay) * mean : mean;
}
