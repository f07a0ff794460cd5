//! Prints the path of a built guest program, for shell use:
//! `valet-run "$(cargo run -q -p valet-guests --bin guest-path -- lsm_sim)"`.

fn main() {
    let Some(name) = std::env::args().nth(1) else {
        eprintln!("usage: guest-path NAME (one of: {})", names().join(", "));
        std::process::exit(2);
    };
    match valet_guests::ALL.iter().find(|(n, _)| *n == name) {
        Some((_, path)) => println!("{path}"),
        None => {
            eprintln!(
                "guest-path: no guest {name} (one of: {})",
                names().join(", ")
            );
            std::process::exit(2);
        }
    }
}

fn names() -> Vec<&'static str> {
    valet_guests::ALL.iter().map(|(n, _)| *n).collect()
}
