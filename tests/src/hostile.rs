//! Inputs a hostile tenant can hand the agent.

/// A mangled C++ name of about 10 bytes a level whose demangled form doubles with each level:
/// `f(A, A<A, A>, A<A<A, A>, A<A, A> >, ...)`, each parameter the template `A` (`S_`) of the
/// previous parameter twice, by back-reference. 20 levels (194 bytes) demangle to 6.8 MB.
pub fn demangling_bomb(levels: u32) -> String {
    /// Substitution `n + 1` is written `S<n in base 36>_`.
    fn back_reference(n: u32) -> String {
        const DIGITS: &[u8] = b"0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ";
        let (mut n, mut digits) = (n, Vec::new());
        loop {
            digits.push(DIGITS[(n % 36) as usize]);
            n /= 36;
            if n == 0 {
                break;
            }
        }
        digits.reverse();
        format!("S{}_", String::from_utf8(digits).expect("ASCII digits"))
    }
    let mut name = String::from("_Z1f1AS_IS_S_E");
    for level in 0..levels.saturating_sub(2) {
        let previous = back_reference(level);
        name += &format!("S_I{previous}{previous}E");
    }
    name
}
