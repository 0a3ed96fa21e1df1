//! decode(encode(text)) == text, for any text.

use proptest::prelude::*;
use proptest::test_runner::RngSeed;

use super::tokenizer;

/// Characters from many scripts plus the troublemakers: whitespace of all
/// kinds, combining marks, joiners, emoji modifiers, apostrophes.
const INTERESTING_CHARS: &str = "aZ09 \t\n\r\u{b}\u{c}\u{1c}\u{85}\u{a0}\u{2028}\u{3000}'’\"!?.,;:-_()[]{}<>|/\\\
    éßøÅ\u{301}\u{308}ΩжЯ中文字한글ひらカナ\u{645}\u{631}\u{928}\u{94d}\u{e01}\u{e34}\
    😀👍🏽\u{200d}\u{fe0f}🇺🇸½²٣\u{feff}\u{fffd}\u{10fffd}";

fn interesting_text() -> impl Strategy<Value = String> {
    let chars: Vec<char> = INTERESTING_CHARS.chars().collect();
    prop::collection::vec(prop::sample::select(chars), 0..120).prop_map(String::from_iter)
}

fn config() -> ProptestConfig {
    ProptestConfig {
        cases: 300,
        rng_seed: RngSeed::Fixed(20_240_925),
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn any_string_round_trips(text in any::<String>()) {
        let ids = tokenizer().encode(&text).unwrap();
        prop_assert_eq!(tokenizer().decode(&ids).unwrap(), text);
    }

    #[test]
    fn mixed_script_text_round_trips(text in interesting_text()) {
        let ids = tokenizer().encode(&text).unwrap();
        prop_assert_eq!(tokenizer().decode(&ids).unwrap(), text);
    }

    /// Encoding produces ordinary tokens only, whatever the text says.
    #[test]
    fn text_never_encodes_to_special_tokens(
        text in "(<\\|(eot_id|begin_of_text|start_header_id|reserved_special_token_[0-9]{1,3})\\|>| |x){0,12}"
    ) {
        let ids = tokenizer().encode(&text).unwrap();
        prop_assert!(ids.iter().all(|&id| id < 128_000), "{:?}", ids);
    }
}
