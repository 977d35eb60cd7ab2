//! The BabyBear and Poseidon2 device code of `kernels/babybear.cuh`, compiled for the host
//! with a plain C++ compiler and compared with the Rust reference on random inputs, so the
//! kernels' arithmetic is checked on machines without a GPU. Skips (with a message) when no
//! C++ compiler is found (`CXX`, `c++`, `g++`, `clang++`).

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use cuda_hal::field::{Elem, ExtElem, P};
use cuda_hal::poseidon2::Poseidon2;

include!("../kernels/host_check/build_host_check.rs");

fn join(v: impl IntoIterator<Item = u32>) -> String {
    v.into_iter()
        .map(|x| x.to_string())
        .collect::<Vec<_>>()
        .join(" ")
}

/// The next value of a xorshift generator (the inputs' source).
fn xorshift(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

#[test]
fn device_arithmetic_matches_the_reference_on_the_host() {
    let exe = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("babybear_host_check");
    if build_host_check(&exe).is_none() {
        return;
    }

    // Commands and the answers the Rust code expects, line by line.
    let mut cmds = String::new();
    let mut want: Vec<String> = Vec::new();
    let mut x = 0x0123_4567_89ab_cdefu64;
    let mut next = || xorshift(&mut x);
    let special = [0, 1, 2, P - 1, P - 2, P / 2, 0x0fff_fffe, 11];
    let mut elem = |i: usize| -> Elem {
        if i < special.len() * special.len() {
            Elem::new(special[i % special.len()])
        } else {
            Elem::from_u64(next())
        }
    };
    for i in 0..20_000 {
        let a = elem(i);
        let b = elem(i / 8 + 1);
        let (a, b) = if i < 64 {
            (Elem::new(special[i % 8]), Elem::new(special[i / 8]))
        } else {
            (a, b)
        };
        cmds += &format!("add {} {}\n", a.as_u32(), b.as_u32());
        want.push((a + b).as_u32().to_string());
        cmds += &format!("sub {} {}\n", a.as_u32(), b.as_u32());
        want.push((a - b).as_u32().to_string());
        cmds += &format!("mul {} {}\n", a.as_u32(), b.as_u32());
        want.push((a * b).as_u32().to_string());
        if i % 20 == 0 {
            let e = u64::from(b.as_u32()) * 3 + i as u64;
            cmds += &format!("pow {} {e}\n", a.as_u32());
            want.push(a.pow(e).as_u32().to_string());
        }
    }
    for i in 0..2000 {
        let a: [Elem; 4] = std::array::from_fn(|j| elem(100 + 4 * i + j));
        let b: [Elem; 4] = std::array::from_fn(|j| elem(9000 + 4 * i + j));
        let r = ExtElem::new(a) * ExtElem::new(b);
        cmds += &format!(
            "ext {} {}\n",
            join(a.map(Elem::as_u32)),
            join(b.map(Elem::as_u32))
        );
        want.push(join(r.coeffs().map(Elem::as_u32)));
    }
    // Shoup operands from Montgomery form (the NTT's twiddles): w = wm * 2^-32 mod p,
    // q = floor(w * 2^32 / p), and x * w mod p for any 32-bit x.
    let r_inv = u64::from(Elem::new(1 << 16).inv().as_u32()).pow(2) % u64::from(P);
    let mut y = 0x9e37_79b9_7f4a_7c15u64;
    let mut draw = || xorshift(&mut y);
    for i in 0..4000 {
        let wm = match special.get(i) {
            Some(&v) if v != 0 => v,
            _ => Elem::from_u64(draw()).as_u32().max(1),
        };
        let x = if i % 7 == 0 {
            u32::MAX - i as u32
        } else {
            draw() as u32
        };
        let w = u64::from(wm) * r_inv % u64::from(P);
        let q = (w << 32) / u64::from(P);
        let prod = u64::from(x) * w % u64::from(P);
        cmds += &format!("shoup {wm} {x}\n");
        want.push(format!("{w} {q} {prod}"));
    }
    for bits in 0..=27u32 {
        for v in [0u32, 1, 5, 0x0555_5555, u32::MAX] {
            let v = if bits == 0 { 0 } else { v & ((1 << bits) - 1) };
            cmds += &format!("rev {v} {bits}\n");
            let r = if bits == 0 {
                0
            } else {
                v.reverse_bits() >> (32 - bits)
            };
            want.push(r.to_string());
        }
    }
    cmds += &format!("table16 {}\n", join(Poseidon2::babybear16().device_table()));
    cmds += &format!("table24 {}\n", join(Poseidon2::babybear24().device_table()));
    for i in 0..300 {
        let s: [Elem; 16] = std::array::from_fn(|j| {
            if i == 0 {
                Elem::new(j as u32)
            } else {
                elem(20_000 + 16 * i + j)
            }
        });
        cmds += &format!("p16 {}\n", join(s.map(Elem::as_u32)));
        want.push(join(
            Poseidon2::babybear16().permuted(s).map(|e| e.as_u32()),
        ));
        let s: [Elem; 24] = std::array::from_fn(|j| {
            if i == 0 {
                Elem::new(j as u32)
            } else {
                elem(40_000 + 24 * i + j)
            }
        });
        cmds += &format!("p24 {}\n", join(s.map(Elem::as_u32)));
        want.push(join(
            Poseidon2::babybear24().permuted(s).map(|e| e.as_u32()),
        ));
    }

    let mut child = Command::new(&exe)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run host_check");
    let mut stdin = child.stdin.take().expect("stdin");
    let writer = std::thread::spawn(move || stdin.write_all(cmds.as_bytes()));
    let out = child.wait_with_output().expect("host_check output");
    writer.join().unwrap().expect("write commands");
    assert!(out.status.success(), "host_check failed");
    let got: Vec<&str> = std::str::from_utf8(&out.stdout).unwrap().lines().collect();
    assert_eq!(got.len(), want.len(), "answer count");
    for (i, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!(g, w, "answer {i}");
    }
}
