//! The report's escaping: Markdown (the templates of `render` and the exports of `export`)
//! and HTML/XML (the charts of `svg`, the pages of `store`).

/// Escapes text for a Markdown table cell or paragraph: HTML specials and the characters that
/// would break a table or start markup.
pub(crate) fn md_escape(s: &str) -> String {
    brownout_protocol::html::escape_with(s, |c, o| {
        match c {
            '|' => o.push_str("\\|"),
            '\n' | '\r' => o.push(' '),
            '*' | '_' | '`' | '[' | ']' | '#' | '\\' => {
                o.push('\\');
                o.push(c);
            }
            // Quotes stay as they are in Markdown text.
            '"' | '\'' => o.push(c),
            _ => return false,
        }
        true
    })
}

/// Text inside an inline code span: no backticks, no pipes, no newlines.
pub(crate) fn code_escape(s: &str) -> String {
    s.chars()
        .map(|c| match c {
            '`' => '\'',
            '|' => '¦',
            '\n' | '\r' => ' ',
            c => c,
        })
        .collect()
}

/// Escapes text for XML/HTML content and attribute values.
pub use brownout_protocol::html::escape as html;
