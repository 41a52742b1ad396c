#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;
fn main() {
    let p = std::env::args().nth(1).unwrap();
    let n: usize = std::env::args()
        .nth(2)
        .map(|s| s.parse().unwrap())
        .unwrap_or(5);
    let bytes = std::fs::read(&p).unwrap();
    let (mut br, mut bd) = (f64::MAX, f64::MAX);
    for _ in 0..n {
        let t = std::time::Instant::now();
        let s = std::hint::black_box(snapdiff_format::read_bytes(&bytes).unwrap());
        br = br.min(t.elapsed().as_secs_f64());
        let t = std::time::Instant::now();
        drop(s);
        bd = bd.min(t.elapsed().as_secs_f64());
    }
    eprintln!("read {:.4} ms drop {:.4} ms", br * 1e3, bd * 1e3);
}
