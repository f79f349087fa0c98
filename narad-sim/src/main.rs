//! `narad-sim`: runs scenarios under the deterministic simulator.

fn main() {
    println!("narad-sim");
}
