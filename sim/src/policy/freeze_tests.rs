//! Tests of `policy/freeze.rs`.
use super::*;
use rand::{RngExt, SeedableRng};
use rand_pcg::Pcg64Mcg;

fn round(x: f64, decimals: i32) -> f64 {
    let s = 10f64.powi(decimals);
    (x * s).round() / s
}

fn vit_b16() -> Vec<SubLayer> {
    vit_sublayers(&VitShape::b16(1000))
}

#[test]
fn closed_form_matches_seeds_table_rows() {
    let rows: [(u32, f64, &[u32]); 4] = [
        (12, 1.0 / 3.0, &[0, 4, 7, 9, 10, 11, 11, 12, 12]),
        (12, 1.0 / 2.0, &[0, 6, 9, 11, 12]),
        (12, 1.0 / 5.0, &[0, 3, 5, 6, 8, 9, 9, 10, 10]),
        (24, 1.0 / 3.0, &[0, 8, 14, 17, 20, 21, 22, 23, 24]),
    ];
    for (l, a, want) in rows {
        let n = want.len() as u32;
        assert_eq!(autofreeze_schedule(l, a, n), want, "L={l} α={a}");
        for e in 0..n {
            assert_eq!(autofreeze_closed_form(l, a, e), want[e as usize], "L={l} α={a} e={e}");
            assert_eq!(autofreeze_plain(l, a, e), want[e as usize], "plain L={l} α={a} e={e}");
        }
    }
    // The α = 1/2 row goes on at 12.
    assert_eq!(autofreeze_schedule(12, 0.5, 9)[4..], [12; 5]);
}

#[test]
fn closed_form_uses_the_codes_arithmetic_at_ceil_boundaries() {
    // Exact 27·19/27 = 19; the code's sum lands just above 19.
    assert_eq!(autofreeze_plain(27, 1.0 / 3.0, 3), 19);
    assert_eq!(autofreeze_closed_form(27, 1.0 / 3.0, 3), 20);
    // Exact 9·(1/9) = 1; the plain form lands just above 1, the code's sum does not.
    assert_eq!(autofreeze_plain(9, 1.0 / 9.0, 1), 2);
    assert_eq!(autofreeze_closed_form(9, 1.0 / 9.0, 1), 1);
    // The code's sum exceeds L late in the schedule; it is clamped.
    assert_eq!(autofreeze_closed_form(1, 0.99, 10), 1);
    // Huge epochs: (1−α)^e underflows; the limit is L.
    assert_eq!(autofreeze_closed_form(12, 0.5, 5000), 12);
    assert_eq!(autofreeze_closed_form(12, 0.5, 0), 0);
}

#[test]
fn closed_form_schedules_are_monotone_and_reach_every_layer() {
    for l in 1..=48 {
        for a in [0.01, 0.07, 0.1, 0.2, 1.0 / 3.0, 0.4, 0.5, 0.6, 0.75, 0.9, 0.99] {
            let s = autofreeze_schedule(l, a, 2000);
            assert_eq!(s[0], 0);
            for e in [1, 2, 3, 5, 8, 13, 60] {
                let want = (0..=e).map(|t| autofreeze_closed_form(l, a, t)).max().unwrap();
                assert_eq!(s[e as usize], want, "L={l} α={a} e={e}");
            }
            assert!(s.windows(2).all(|w| w[0] <= w[1]), "L={l} α={a}");
            assert_eq!(*s.last().unwrap(), l, "L={l} α={a}");
            for e in 1..60u32 {
                let (c, p) = (autofreeze_closed_form(l, a, e), autofreeze_plain(l, a, e));
                assert!(c <= l && c.abs_diff(p) <= 1, "L={l} α={a} e={e}: {c} vs {p}");
            }
        }
    }
}

#[test]
#[should_panic(expected = "0 < alpha < 1")]
fn closed_form_rejects_alpha_one() {
    autofreeze_closed_form(12, 1.0, 1);
}

#[test]
fn vit_b16_sublayer_sizes_match_seeds() {
    let s = vit_b16();
    assert_eq!(s.len(), 27);
    let by_name = |n: &str| s.iter().find(|x| x.name == n).unwrap().params_m;
    assert_eq!(round(by_name("embedding"), 4), 0.7427);
    assert_eq!(round(by_name("mha_0"), 4), 2.3639);
    assert_eq!(round(by_name("mlp_11"), 4), 4.7240);
    assert_eq!(round(by_name("encoder_norm"), 4), 0.0015);
    assert_eq!(round(by_name("head"), 3), 0.769);
    assert_eq!((s.iter().map(|x| x.params_m).sum::<f64>() * 1e6).round(), 86_567_656.0);
    assert_eq!(s[1].block, Some(0));
    assert_eq!(s[2].kind, SubLayerKind::Mlp);
    assert_eq!(block_count(&s), 12);
    assert_eq!(VitShape::b16(10).head_params(), 7690);
}

#[test]
fn greedy_reproduces_vit_b16_k8() {
    let sizes: Vec<f64> = vit_b16().iter().map(|s| s.params_m).collect();
    let p = greedy_partition(8, &sizes, 0.0);
    assert_eq!(p.units, [4, 2, 3, 3, 3, 3, 4, 5]);
    let rounded: Vec<f64> = p.params_m.iter().map(|&x| round(x, 2)).collect();
    assert_eq!(rounded, [10.19, 7.09, 11.81, 9.45, 11.81, 9.45, 14.18, 12.58]);
    assert_eq!(round(p.max_params_m(), 2), 14.18);
}

#[test]
fn greedy_reproduces_vit_b16_k4_ten_classes() {
    let sizes: Vec<f64> = vit_sublayers(&VitShape::b16(10)).iter().map(|s| s.params_m).collect();
    let p = greedy_partition(4, &sizes, 0.0);
    assert_eq!(round(p.max_params_m(), 3), 22.006);
    assert_eq!(p.units.iter().sum::<u32>(), 27);
}

#[test]
fn greedy_covers_in_order_and_frozen_weighting_widens_device_zero() {
    let mut rng = Pcg64Mcg::seed_from_u64(7);
    for _ in 0..500 {
        let n = rng.random_range(0..40usize);
        let sizes: Vec<f64> = (0..n).map(|_| rng.random_range(0.0..10.0)).collect();
        let k = rng.random_range(1..10u32);
        let p = greedy_partition(k, &sizes, 0.0);
        assert_eq!(p.units.len(), k as usize);
        assert_eq!(p.units.iter().sum::<u32>() as usize, n);
        let mut at = 0usize;
        for (d, &u) in p.units.iter().enumerate() {
            let want: f64 = sizes[at..at + u as usize].iter().sum();
            assert!((want - p.params_m[d]).abs() <= 1e-9, "{sizes:?} {p:?}");
            at += u as usize;
        }
        let frozen = rng.random_range(0.0..20.0);
        assert!(greedy_partition(k, &sizes, frozen).units[0] >= p.units[0]);
    }
    // A single device takes everything; a frozen discount lets device 0 take more.
    assert_eq!(greedy_partition(1, &[1.0, 2.0, 3.0], 0.0).units, [3]);
    // The threshold is strict: 3 + 3 is not < mean 6 + var 0, so the last device takes the rest.
    assert_eq!(greedy_partition(2, &[3.0, 3.0, 3.0, 3.0], 0.0).units, [1, 3]);
    assert_eq!(greedy_partition(2, &[3.0, 3.0, 3.0, 3.0], 3.0).units, [2, 2]);
    // Population variance: mean 5.5 + 16.75/4/2 = 7.59375 < 1 + 1 + 6; the sample variance
    // (16.75/3/2) would give 8.29 and [3, 1].
    let p = greedy_partition(2, &[1.0, 1.0, 6.0, 3.0], 0.0);
    assert_eq!((p.units, p.params_m), (vec![2, 2], vec![2.0, 9.0]));
}

#[test]
fn active_sublayers_drop_embedding_and_frozen_blocks() {
    let s = vit_b16();
    assert_eq!(active_sublayers(&s, 0).len(), 27);
    let a = active_sublayers(&s, 4);
    assert_eq!(a.len(), 2 * 8 + 2);
    assert_eq!(a[0].name, "mha_4");
    assert_eq!(a[a.len() - 2].name, "encoder_norm");
    assert_eq!(a[a.len() - 1].name, "head");
    let names: Vec<&str> = active_sublayers(&s, 12).iter().map(|x| x.name.as_str()).collect();
    assert_eq!(names, ["encoder_norm", "head"]);
    assert!(frozen_params_m(&s, 0) == 0.0 && frozen_params_m(&s, 0).is_sign_positive());
    let f4 = frozen_params_m(&s, 4);
    assert!((f4 - (0.742656 + 4.0 * (2.363904 + 4.723968))).abs() < 1e-9);
}

#[test]
fn compression_from_scratch_follows_the_trace() {
    let s = vit_b16();
    assert_eq!(round(initial_max_params_m(&s, 8), 2), 14.18);
    let ks: Vec<u32> = [4, 6, 7, 9, 10, 11, 12].iter().map(|&f| compressed_length(&s, 8, 8, f)).collect();
    assert_eq!(ks, [8, 4, 4, 2, 2, 1, 1]);
    assert_eq!(compressed_length(&s, 8, 2, 11), 1);
    assert_eq!(compressed_length(&s, 8, 4, 4), 4);
}

#[test]
fn elastic_schedule_vit_b16_alpha_one_third() {
    let frozen = autofreeze_schedule(12, 1.0 / 3.0, 6);
    assert_eq!(frozen, [0, 4, 7, 9, 10, 11]);
    let plans = elastic_schedule(&frozen, 8, 2, 8, &vit_b16());
    let k: Vec<u32> = plans.iter().map(|p| p.pipeline_length).collect();
    let r: Vec<u32> = plans.iter().map(|p| p.replicas).collect();
    let m: Vec<u32> = plans.iter().map(|p| p.micro_batches).collect();
    assert_eq!(k, [8, 8, 4, 2, 2, 1]);
    assert_eq!(r, [2, 2, 4, 8, 8, 16]);
    assert_eq!(m, [16, 16, 16, 16, 16, 4]);
    assert_eq!(plans[0].partition, [4, 2, 3, 3, 3, 3, 4, 5]);
    assert_eq!(plans[5].partition, [4]);
    assert_eq!(plans.iter().map(|p| p.epoch).collect::<Vec<_>>(), [0, 1, 2, 3, 4, 5]);
    for p in &plans {
        assert_eq!(p.partition.iter().sum::<u32>(), active_sublayers(&vit_b16(), p.frozen_layers).len() as u32);
        assert!((p.active_params_m + p.frozen_params_m - 86.567656).abs() < 1e-9);
    }
    // 12 frozen stays at K = 1.
    let more = elastic_schedule(&autofreeze_schedule(12, 1.0 / 3.0, 9), 8, 2, 8, &vit_b16());
    assert_eq!(more.iter().map(|p| p.pipeline_length).collect::<Vec<_>>(), [8, 8, 4, 2, 2, 1, 1, 1, 1]);
}

#[test]
fn elastic_schedule_vit_b16_alpha_one_half() {
    let frozen = autofreeze_schedule(12, 0.5, 5);
    assert_eq!(frozen, [0, 6, 9, 11, 12]);
    let plans = elastic_schedule(&frozen, 8, 2, 8, &vit_b16());
    assert_eq!(plans.iter().map(|p| p.pipeline_length).collect::<Vec<_>>(), [8, 4, 2, 1, 1]);
    assert_eq!(plans.iter().map(|p| p.replicas).collect::<Vec<_>>(), [2, 4, 8, 16, 16]);
}

#[test]
fn elastic_schedule_invariants_on_random_runs() {
    let mut rng = Pcg64Mcg::seed_from_u64(11);
    for _ in 0..200 {
        let classes = [10, 100, 1000][rng.random_range(0..3usize)];
        let s = vit_sublayers(&VitShape::b16(classes));
        let k0 = [1, 2, 4, 8][rng.random_range(0..4usize)];
        let nodes = rng.random_range(1..4u32);
        let mut f = 0;
        let frozen: Vec<u32> = (0..rng.random_range(1..15))
            .map(|_| {
                f = (f + rng.random_range(0..4u32)).min(12);
                f
            })
            .collect();
        let s_max0 = initial_max_params_m(&s, k0);
        let plans = elastic_schedule(&frozen, k0, nodes, 8, &s);
        assert_eq!(plans.len(), frozen.len());
        for (i, p) in plans.iter().enumerate() {
            assert!(p.pipeline_length.is_power_of_two() && k0 % p.pipeline_length == 0);
            assert_eq!(p.replicas * p.pipeline_length, nodes * k0);
            assert_eq!(p.partition.len(), p.pipeline_length as usize);
            if p.pipeline_length < k0 {
                assert!(p.stage_params_m.iter().all(|&x| x <= s_max0), "{p:?}");
            }
            // Compression stopped because halving once more would exceed S_max(0).
            if p.pipeline_length > 1 && p.frozen_layers > 0 {
                let active = active_sizes(&s, p.frozen_layers);
                assert!(greedy_partition(p.pipeline_length / 2, &active, 0.0).max_params_m() > s_max0, "{p:?}");
            }
            if i > 0 {
                assert!(p.pipeline_length <= plans[i - 1].pipeline_length);
                if p.frozen_layers == plans[i - 1].frozen_layers {
                    assert_eq!(p.pipeline_length, plans[i - 1].pipeline_length);
                }
            }
        }
    }
}

#[test]
#[should_panic(expected = "exceeds the 4 GPUs")]
fn elastic_schedule_rejects_k0_over_node() {
    elastic_schedule(&[0], 8, 2, 4, &vit_b16());
}

#[test]
#[should_panic(expected = "power of two")]
fn elastic_schedule_rejects_non_power_of_two() {
    elastic_schedule(&[0], 6, 2, 8, &vit_b16());
}

#[test]
#[should_panic(expected = "decrease")]
fn elastic_schedule_rejects_unfreezing() {
    elastic_schedule(&[0, 4, 3], 8, 2, 8, &vit_b16());
}

#[test]
fn micro_batches_follow_the_codes_table() {
    assert_eq!(micro_batches_for(8), 16);
    assert_eq!(micro_batches_for(4), 16);
    assert_eq!(micro_batches_for(2), 16);
    assert_eq!(micro_batches_for(1), 4);
    assert_eq!(micro_batches_for(16), 64);
    assert_eq!(micro_batches_for(3), 12);
}

#[test]
fn gradient_rule_hand_made_trace() {
    let trace = vec![
        vec![10.0, 10.0, 10.0, 10.0, 10.0],
        // r = [0.1, 0.15, 0.2, 0.5, 0]: median 0.15; layer 1 has r = τ → 2 frozen for epoch 2.
        vec![9.0, 8.5, 8.0, 5.0, 10.0],
        // Unfrozen r = [0.05, 0.5, 0.3] (layers 2..5): median 0.3; layer 3 → 4 frozen.
        // (Frozen layers' changes are ignored: layer 0 moved by 100 %.)
        vec![18.0, 8.5, 7.6, 2.5, 7.0],
        // Only layer 4 is left: τ = its own r → all 5 frozen.
        vec![1.0, 1.0, 1.0, 1.0, 6.0],
        vec![1.0, 1.0, 1.0, 1.0, 1.0],
    ];
    assert_eq!(gradient_rule(&trace), [0, 0, 2, 4, 5]);
    // Even count, relative to the previous epoch: r = [0.3, 0.4, 0.2, 0.9]; NumPy's median is
    // 0.35 (the lower middle 0.3 would pick layer 0; relative to the new values, r would be
    // [0.43, 0.29, 0.17, 0.47] with median 0.36 and pick layer 0 too) → layer 1 → 2.
    let even = vec![vec![10.0; 4], vec![7.0, 14.0, 12.0, 19.0], vec![0.0; 4]];
    assert_eq!(gradient_rule(&even), [0, 0, 2]);
    // τ = 0 (most active layers did not change): layer 0 matches, so the first evaluation
    // freezes only layer 0 and the second (τ = 0 again) nothing more.
    let flat = vec![vec![3.0; 4], vec![3.0, 3.0, 3.0, 1.0], vec![3.0, 3.0, 3.0, 1.0], vec![1.0; 4]];
    assert_eq!(gradient_rule(&flat), [0, 0, 1, 1]);
    // A gradient that drops to 0 counts as no change (r = 0, not 1): r = [0, 0, 0.1], τ = 0 → 1.
    let zero = vec![vec![10.0; 3], vec![10.0, 0.0, 9.0], vec![1.0; 3]];
    assert_eq!(gradient_rule(&zero), [0, 0, 1]);
    assert!(gradient_rule(&[]).is_empty());
}

#[test]
fn gradient_rule_is_monotone_and_freezes_all_on_the_synthetic_trace() {
    for seed in 0..50 {
        for layers in [1u32, 4, 12, 24] {
            let trace = synthetic_trace(layers, layers + 2, seed);
            let s = gradient_rule(&trace);
            assert_eq!(s.len(), trace.len());
            assert_eq!(s[0], 0);
            assert!(s.windows(2).all(|w| w[0] <= w[1]), "{s:?}");
            assert_eq!(*s.last().unwrap(), layers, "seed {seed}: {s:?}");
        }
    }
    // Random traces: never decreasing, never beyond L, nothing frozen in epochs 0 and 1.
    let mut rng = Pcg64Mcg::seed_from_u64(3);
    for _ in 0..300 {
        let layers = rng.random_range(1..16usize);
        let trace: Vec<Vec<f64>> = (0..rng.random_range(1..20))
            .map(|_| (0..layers).map(|_| if rng.random_bool(0.1) { 0.0 } else { rng.random_range(0.0..5.0) }).collect())
            .collect();
        let s = gradient_rule(&trace);
        assert_eq!(s.len(), trace.len());
        assert!(s.iter().take(2).all(|&x| x == 0));
        assert!(s.windows(2).all(|w| w[0] <= w[1]) && s.iter().all(|&x| x as usize <= layers), "{s:?}");
    }
}

#[test]
fn synthetic_trace_is_seeded_and_lower_layers_converge_earlier() {
    let a = synthetic_trace(12, 10, 42);
    assert_eq!(a, synthetic_trace(12, 10, 42));
    assert_ne!(a, synthetic_trace(12, 10, 43));
    assert_eq!((a.len(), a[0].len()), (10, 12));
    assert!(a.iter().flatten().all(|&g| g > 0.0 && g.is_finite()));
    // Every layer decays from epoch 0 to the last; layer 0 keeps less of its start than layer 11.
    assert!(a[9].iter().zip(&a[0]).all(|(last, first)| last < first));
    assert!(a[9][0] / a[0][0] < a[9][11] / a[0][11]);
}
