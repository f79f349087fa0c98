//! The `narad` binary.

fn main() {
    println!("narad");
}
